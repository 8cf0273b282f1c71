"""Tiny real models for tests and benchmarks, made here: nothing comes from a model hub.

A Llama causal LM with random weights (head_dim 32, the least vLLM's CPU attention takes) and a
byte-level BPE tokenizer trained on a few lines, saved with ``save_pretrained`` so that
transformers, the embedded engine and vLLM all load them as they would a real checkpoint; and
a tiny Qwen3-MoE (4 experts, tied embeddings), whose experts transformers fuses at load.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3MoeConfig,
)

from actorsys.fleet.model_load import load_causal_lm

EOS = "<|endoftext|>"
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a trainer hands over a snapshot and goes on training",
    "engines load the weights and answer with the pinned version",
    "every point settles exactly once skipped or scored",
    "structured concurrency keeps every task inside its nursery",
    "one two three four five six seven eight nine ten",
]
PROMPTS = ["the quick brown", "engines load", "one two three", "a trainer hands"]


def make_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # Only the corpus' own characters (lower-case ASCII and space) are in the alphabet, so
    # every token decodes to whole characters and incremental detokenisation (vLLM's) gives
    # the same text as decoding all tokens at once.
    trainer = trainers.BpeTrainer(vocab_size=160, special_tokens=[EOS])
    tokenizer.train_from_iterator(CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS,
        pad_token=EOS,
        clean_up_tokenization_spaces=False,
    )


def tiny_config(
    vocab_size: int,
    eos_id: int,
    *,
    hidden: int = 64,
    layers: int = 2,
    tied: bool = False,
    kv_heads: int | None = None,
) -> LlamaConfig:
    """``tied``: the head is the embedding (``save_pretrained`` writes only ``embed_tokens``).
    ``kv_heads``: fewer key/value heads than query heads (GQA)."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 32,
        num_key_value_heads=kv_heads or hidden // 32,
        head_dim=32,
        max_position_embeddings=512,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        tie_word_embeddings=tied,
    )


def tiny_moe_config(vocab_size: int, eos_id: int, *, hidden: int = 64, experts: int = 4) -> Qwen3MoeConfig:
    """A 2-layer Qwen3-MoE, every layer sparse (``experts`` experts, 2 per token), tied
    embeddings."""
    return Qwen3MoeConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        moe_intermediate_size=hidden,
        num_experts=experts,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        num_hidden_layers=2,
        num_attention_heads=hidden // 32,
        num_key_value_heads=hidden // 32,
        head_dim=32,
        max_position_embeddings=512,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        tie_word_embeddings=True,
    )


def make_model(
    directory: str | os.PathLike[str],
    *,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    tied: bool = False,
    kv_heads: int | None = None,
    moe: bool = False,
) -> PreTrainedModel:
    """Create a tiny Llama (``moe``: the tiny Qwen3-MoE) with its tokenizer in ``directory``
    (created), marked ``.complete``."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer()
    tokenizer.save_pretrained(path)
    config = (
        tiny_moe_config(len(tokenizer), tokenizer.eos_token_id, hidden=hidden)
        if moe
        else tiny_config(
            len(tokenizer),
            tokenizer.eos_token_id,
            hidden=hidden,
            layers=layers,
            tied=tied,
            kv_heads=kv_heads,
        )
    )
    model = random_model(config, seed)
    model.save_pretrained(path)
    (path / ".complete").write_bytes(b"")
    return model


def random_model(config: PretrainedConfig, seed: int) -> PreTrainedModel:
    torch.manual_seed(seed)
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.5)
    return model.eval()


def make_snapshot(
    base: str | os.PathLike[str],
    directory: str | os.PathLike[str],
    *,
    seed: int,
    dtype: torch.dtype = torch.float32,
) -> PreTrainedModel:
    """A checkpoint of ``base``'s architecture and tokenizer with other random weights,
    stored in ``dtype``."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(base)
    tokenizer.save_pretrained(path)
    config = AutoConfig.from_pretrained(base)
    model = random_model(config, seed).to(dtype)
    model.save_pretrained(path)
    (path / ".complete").write_bytes(b"")
    return model


def greedy(model_dir: str | os.PathLike[str], prompts: list[str], max_new_tokens: int) -> list[str]:
    """What transformers' own ``generate`` answers, greedy, one prompt at a time."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = load_causal_lm(model_dir, dtype=torch.float32).eval()
    texts = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
            )
        texts.append(tokenizer.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=True))
    return texts

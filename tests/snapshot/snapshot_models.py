"""Tiny real models, tokenizers and file systems for the snapshot and export tests.

Everything is created locally: random weights, a tokenizer trained on a few lines.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    MixtralConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from actorsys.fleet.model_load import load_causal_lm

VOCAB = 256
CHAT_TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
LINES = [
    "the trainer hands over a snapshot and goes on training",
    "an exporter writes the checkpoint in the background",
    "a fleet of engines is pinned to exactly that version",
    "every submitted point settles exactly once",
]


def tiny_llama(
    *, dtype: torch.dtype = torch.float32, tied: bool = True, seed: int = 0
) -> PreTrainedModel:
    """A 2-layer Llama with random weights, created the way ``from_pretrained`` creates one
    (non-persistent rotary buffers stay float32 in a bf16 model)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
    )
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def tiny_mixtral(*, seed: int = 0) -> PreTrainedModel:
    """A 1-layer, 2-expert Mixtral: transformers fuses its experts at load and splits them
    back on save."""
    torch.manual_seed(seed)
    config = MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_local_experts=2,
        head_dim=32,
    )
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config)
    return model.eval()


def input_ids(seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (2, 16), generator=generator)


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(ids).logits
    return out


def load(path: str) -> PreTrainedModel:
    """Load a snapshot the way an evaluator would (dtype from its config)."""
    model: PreTrainedModel = load_causal_lm(path)
    return model.eval()


def trained_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"])
    tokenizer.train_from_iterator(LINES, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_base_checkpoint(path: str, model: PreTrainedModel) -> str:
    """An HF dir as a trainer starts from: config, tuned generation config, tokenizer files,
    chat template, and weights of its own (which an export must never copy)."""
    os.makedirs(path, exist_ok=True)
    model.config.save_pretrained(path)
    tuned = GenerationConfig(bos_token_id=1, eos_token_id=2, temperature=0.6, do_sample=True)
    tuned.save_pretrained(path)
    trained_tokenizer().save_pretrained(path)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(b"not the weights an export should contain")
    return path


def fill_disk(path: str, *, leave: int) -> None:
    """Write a file at ``path`` that leaves only ``leave`` bytes free on its file system."""
    with open(path, "wb") as f:
        f.write(b"\0" * (shutil.disk_usage(os.path.dirname(path)).free - leave))


@contextlib.contextmanager
def tmpfs(path: str, size: str) -> Iterator[str | None]:
    """Mount a tmpfs of ``size`` at ``path``; yields None where mounting is not allowed."""
    os.makedirs(path, exist_ok=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        yield None
        return
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True, check=False)

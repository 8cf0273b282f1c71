"""The demo's task: 2-digit addition as text (``"23+45="`` -> ``"68"``), learnt from scratch.

A character tokenizer and a small Llama (head_dim 32, untied embeddings, so vLLM's CPU build
can serve and reload it) are made here; nothing is downloaded. A fixed set of problems is
held out of training and written as JSONL for the ``numeric`` scorer. Everything is seeded,
so a run with the same settings learns the same way.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHARS = "0123456789+="
SPECIALS = ("[PAD]", "[EOS]", "[UNK]")
HELD_OUT = 100
ANSWER_TOKENS = 4
IGNORE = -100


def make_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: index for index, token in enumerate([*CHARS, *SPECIALS])}
    model = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    model.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    model.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=model, pad_token="[PAD]", eos_token="[EOS]", unk_token="[UNK]"
    )


def model_config(tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=32,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )


def new_model(config: LlamaConfig, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def prompt(a: int, b: int) -> str:
    return f"{a}+{b}="


@dataclass
class AdditionTask:
    """The problems split into training and held-out ones, and batches of the former."""

    tokenizer: PreTrainedTokenizerFast
    seed: int = 0

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        problems = [(a, b) for a in range(100) for b in range(100)]
        rng.shuffle(problems)
        self.held_out = problems[:HELD_OUT]
        self.train = problems[HELD_OUT:]
        self._rng = random.Random(self.seed + 1)

    def write_held_out(self, path: str) -> None:
        """One ``{"prompt", "label"}`` object a line: the held-out problems."""
        with open(path, "w", encoding="utf-8") as f:
            for a, b in self.held_out:
                f.write(json.dumps({"prompt": prompt(a, b), "label": str(a + b)}) + "\n")

    def batch(self, size: int) -> dict[str, torch.Tensor]:
        """``size`` random training problems: ids, mask, and labels on the answer only."""
        eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id
        rows: list[tuple[list[int], list[int]]] = []
        for _ in range(size):
            a, b = self.train[self._rng.randrange(len(self.train))]
            question = self.tokenizer(prompt(a, b))["input_ids"]
            answer = [*self.tokenizer(str(a + b))["input_ids"], eos]
            rows.append(([*question, *answer], [IGNORE] * len(question) + answer))
        width = max(len(ids) for ids, _ in rows)
        ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in rows])
        labels = torch.tensor([lab + [IGNORE] * (width - len(lab)) for _, lab in rows])
        mask = (labels != IGNORE) | (ids != pad)
        return {"input_ids": ids, "attention_mask": mask.long(), "labels": labels}


def write_base_checkpoint(directory: str, seed: int = 0) -> tuple[AdditionTask, LlamaForCausalLM]:
    """Write the tokenizer, the config and the untrained weights into ``directory`` (what the
    engines serve first and every snapshot copies its non-weight files from)."""
    tokenizer = make_tokenizer()
    model = new_model(model_config(tokenizer), seed)
    os.makedirs(directory, exist_ok=True)
    tokenizer.save_pretrained(directory)
    model.save_pretrained(directory)
    return AdditionTask(tokenizer, seed), model

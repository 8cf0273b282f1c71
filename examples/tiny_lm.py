"""What the training examples share: a tiny causal LM made locally, and an eval fn that loads
each snapshot back with transformers and scores it.

Nothing is downloaded: the tokenizer is trained on the few lines below and the model starts
from random weights. The base checkpoint (config + tokenizer) is what every snapshot copies
its non-weight files from.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import tempfile
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from actorsys import CheckpointEvalFn, EvalConfig, Outcome, RolloutFnEvalInput, RolloutFnEvalOutput

TRAIN_TEXTS = [
    "the trainer hands over a snapshot and goes on training",
    "the evaluation runs on its own while the weights keep changing",
    "every point settles once with a score or a reason",
    "a hung evaluation never stalls the trainer at exit",
]
EVAL_TEXTS = [
    "the trainer hands over a snapshot",
    "every point settles once",
]


def make_base_checkpoint(directory: str) -> tuple[PreTrainedTokenizerFast, LlamaConfig]:
    """Train a word-level tokenizer on the texts above and write it, with a small Llama
    config (head_dim 32), into ``directory``."""
    tokenizer_model = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer_model.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]", "[EOS]"])
    tokenizer_model.train_from_iterator(TRAIN_TEXTS + EVAL_TEXTS, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer_model, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]"
    )
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    os.makedirs(directory, exist_ok=True)
    tokenizer.save_pretrained(directory)
    config.save_pretrained(directory)
    return tokenizer, config


def parse_training_args(
    description: str, argv: list[str] | None, *, steps: int, every: int
) -> argparse.Namespace:
    """The flags every training example takes: ``--steps``, ``--eval-every``, ``--workdir``,
    ``--results`` and EvalConfig's own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--eval-every", type=int, default=every, metavar="K")
    parser.add_argument("--workdir", help="where the base checkpoint, snapshots and logs go")
    parser.add_argument("--results", help="write the outcomes and the eval rows here (JSON)")
    EvalConfig.add_arguments(parser)
    return parser.parse_args(argv)


def write_results(path: str | None, outcomes: list[Outcome], eval_rows: list[dict[str, Any]]) -> None:
    """The outcomes and the eval rows the trainer logged, as JSON in ``path`` (if given)."""
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"outcomes": [dataclasses.asdict(o) for o in outcomes],
                       "eval_rows": eval_rows}, f, default=repr)


def set_up(args: argparse.Namespace) -> tuple[PreTrainedTokenizerFast, LlamaConfig, EvalConfig]:
    """Write the base checkpoint into ``args.workdir`` (a new tmp dir if unset) and build the
    EvalConfig from the trainer's flags, staging under the workdir unless the flags say where."""
    workdir = args.workdir or tempfile.mkdtemp(prefix="actorsys-train-")
    base = os.path.join(workdir, "base")
    tokenizer, model_config = make_base_checkpoint(base)
    overrides: dict[str, object] = {"base_checkpoint": base}
    if args.eval_hf_dir is None and args.save_hf is None:
        overrides["hf_dir"] = os.path.join(workdir, "staging")
    return tokenizer, model_config, EvalConfig.from_args(args, **overrides)


def new_model(config: LlamaConfig, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def batch(tokenizer: Any, texts: list[str]) -> dict[str, torch.Tensor]:
    """Token ids, attention mask and labels (padding ignored) for ``texts``."""
    encoded = tokenizer(texts, return_tensors="pt", padding=True)
    labels = encoded["input_ids"].masked_fill(encoded["attention_mask"] == 0, -100)
    return {**encoded, "labels": labels}


def train_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: dict[str, Any]
) -> float:
    model.train()
    loss = model(**inputs).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach())


class PerplexityEval(CheckpointEvalFn):
    """Loads a snapshot with transformers and scores it on ``EVAL_TEXTS``.

    A plain ``def`` (torch blocks), so it runs in a worker thread of the supervisor
    (``runtime = "thread"``); it pins no fleet of its own: the snapshot on disk is the model.
    """

    runtime = "thread"

    def evaluate_checkpoint(
        self, checkpoint_dir: str, eval_input: RolloutFnEvalInput
    ) -> RolloutFnEvalOutput:
        tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir)
        model = AutoModelForCausalLM.from_pretrained(checkpoint_dir)
        model.eval()
        with torch.no_grad():
            loss = float(model(**batch(tokenizer, EVAL_TEXTS)).loss)
        return RolloutFnEvalOutput(
            data={"texts": len(EVAL_TEXTS)},
            metrics={"eval/loss": loss, "eval/perplexity": math.exp(loss)},
        )


class PrintSink:
    """Prints each outcome as it settles, and keeps them."""

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    def summary(self) -> str:
        ok = sum(outcome.ok for outcome in self.outcomes)
        return f"{ok} points evaluated, {len(self.outcomes) - ok} skipped"

    def record(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        if outcome.ok:
            print(
                f"  eval step {outcome.step:>4}: loss {outcome.metrics['eval/loss']:.3f} "
                f"perplexity {outcome.metrics['eval/perplexity']:.2f} "
                f"(lag {outcome.metrics.get('eval/lag_steps', 0):.0f} steps)",
                flush=True,
            )
        else:
            print(f"  eval step {outcome.step:>4}: skipped ({outcome.reason})", flush=True)

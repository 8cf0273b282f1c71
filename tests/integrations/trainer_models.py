"""What the trainer-callback tests share: a tiny Llama and its base checkpoint made here,
token batches to train it on, and an eval fn that keeps the tensors each snapshot holds."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import torch
import trio
from safetensors.torch import load_file

from actorsys import CheckpointEvalFn, RolloutFnEvalInput, RolloutFnEvalOutput
from tests.models import CORPUS, make_model, make_tokenizer

SEQUENCE = 16


def base_model(directory: Path, *, tied: bool = False) -> torch.nn.Module:
    """A tiny Llama (random weights) saved with its tokenizer in ``directory``."""
    model = make_model(directory, seed=0, tied=tied)
    return model.train()


def token_rows(count: int = 64) -> list[dict[str, list[int]]]:
    """Rows of ``input_ids``/``attention_mask``/``labels`` of one length (default collator)."""
    tokenizer = make_tokenizer()
    rows = []
    for index in range(count):
        ids = tokenizer(CORPUS[index % len(CORPUS)])["input_ids"][:SEQUENCE]
        pad = SEQUENCE - len(ids)
        rows.append({
            "input_ids": ids + [tokenizer.pad_token_id] * pad,
            "attention_mask": [1] * len(ids) + [0] * pad,
            "labels": ids + [-100] * pad,
        })
    return rows


def snapshot_tensors(checkpoint_dir: str) -> dict[str, torch.Tensor]:
    files = sorted(Path(checkpoint_dir).glob("*.safetensors"))
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        tensors.update(load_file(path))
    return tensors


class KeepsSnapshots(CheckpointEvalFn):
    """Reads each snapshot's tensors back (kept by step) and scores their mean square.

    ``slow_steps``: those points sleep ``slow_seconds`` first (wall clock: the bridge's trio
    thread runs a real clock); ``hang_steps``: those never finish until cancelled.
    """

    def __init__(
        self, *, slow_steps: tuple[int, ...] = (), slow_seconds: float = 0.0,
        hang_steps: tuple[int, ...] = (),
    ) -> None:
        self.tensors: dict[int, dict[str, torch.Tensor]] = {}
        self.finished_at: dict[int, float] = {}
        self.slow_steps, self.slow_seconds, self.hang_steps = slow_steps, slow_seconds, hang_steps
        self._lock = threading.Lock()

    async def evaluate_checkpoint(
        self, checkpoint_dir: str, eval_input: RolloutFnEvalInput
    ) -> RolloutFnEvalOutput:
        step = int(eval_input.rollout_id)
        if step in self.hang_steps:
            await trio.sleep_forever()
        if step in self.slow_steps:
            await trio.sleep(self.slow_seconds)
        tensors = await trio.to_thread.run_sync(snapshot_tensors, checkpoint_dir)
        square = sum(float((t.double() ** 2).sum()) for t in tensors.values())
        count = sum(t.numel() for t in tensors.values())
        with self._lock:
            self.tensors[step] = tensors
            self.finished_at[step] = time.monotonic()
        return RolloutFnEvalOutput(data={}, metrics={"eval/mean_square": square / count,
                                                     "eval/rms": math.sqrt(square / count)})


def eval_rows(log_history: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The eval rows of a trainer's ``log_history``, by the step their weights came from."""
    return {int(row["eval/step"]): row for row in log_history if "eval/step" in row}

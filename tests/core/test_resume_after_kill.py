"""A real trainer killed with points in flight; the next supervisor on its hf_dir, with
``resume=True``, evaluates the killed run's complete points at their steps (on those steps'
weights) and retires the half-written one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from actorsys import (
    CheckpointEvalFn,
    EvalConfig,
    EvalSupervisor,
    MemorySink,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from actorsys._core.journal import JOURNAL_NAME
from tests.conftest import snapshot_dirs, tmp_dirs
from tests.snapshot.snapshot_models import tiny_llama

ROOT = Path(__file__).resolve().parents[2]
READY_SECONDS = 180


class WeightsEval(CheckpointEvalFn):
    """Scores 1.0 when the checkpoint holds exactly the weights of ``tiny_llama(seed=step)``
    (made before it runs: torch's seed is global, and the trainer makes models meanwhile)."""

    runtime = "thread"

    def __init__(self, steps: list[int]) -> None:
        self.seen: list[int] = []
        self.weights = {step: tiny_llama(seed=step).state_dict() for step in steps}

    def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        self.seen.append(input.rollout_id)
        stored: dict[str, torch.Tensor] = {}
        for name in sorted(os.listdir(checkpoint_dir)):
            if name.endswith(".safetensors"):
                stored.update(load_file(os.path.join(checkpoint_dir, name)))
        expected = self.weights[input.rollout_id]
        same = bool(stored) and all(torch.equal(tensor, expected[key]) for key, tensor in stored.items())
        return RolloutFnEvalOutput(data={"tensors": len(stored)}, metrics={"same_weights": float(same)})


def kill_trainer_with_points_in_flight(hf: Path, metrics: Path) -> None:
    trainer = subprocess.Popen(
        [sys.executable, "-m", "tests.core.crashing_trainer", str(hf), str(metrics)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert trainer.stdout is not None
        line = trainer.stdout.readline()  # bounded by the test's timeout
        assert line.strip() == "ready", trainer.stderr.read() if trainer.stderr else line
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(60)
    assert trainer.returncode == -signal.SIGKILL


@pytest.mark.slow
@pytest.mark.timeout(READY_SECONDS + 120)
async def test_a_killed_trainers_unsettled_complete_points_are_evaluated_at_their_steps(
    tmp_path: Path,
) -> None:
    hf, metrics = tmp_path / "hf", tmp_path / "metrics.jsonl"
    kill_trainer_with_points_in_flight(hf, metrics)
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [0]
    assert snapshot_dirs(hf) == ["step_0", "step_1", "step_2"]
    assert [name.startswith(".tmp-step_3-") for name in tmp_dirs(hf)] == [True]

    sink, eval_fn = MemorySink(), WeightsEval([1, 2, 4])
    config = EvalConfig(hf_dir=hf, max_in_flight=4, keep_snapshots=1, probe=False, resume=True)
    async with EvalSupervisor.open(config, eval_fn=eval_fn, sink=sink) as sup:
        assert tmp_dirs(hf) == []  # the half export of step 3 is retired
        assert await sup.submit(4, model=tiny_llama(seed=4))
        assert await sup.submit(2, model=tiny_llama(seed=2)) is False  # resumed instead
        report = await sup.drain(timeout=120)
    assert report.pending == []
    assert [(o.step, o.status, o.metrics["same_weights"]) for o in sink.outcomes] == [
        (1, "ok", 1.0), (2, "ok", 1.0), (4, "ok", 1.0)
    ]
    assert eval_fn.seen == [1, 2, 4]  # the killed run's points first
    assert sink.by_step()[1].snapshot == str(hf / "step_1")
    assert "step_3" not in snapshot_dirs(hf)

    rows = [json.loads(line) for line in (hf / JOURNAL_NAME).read_text().splitlines()]
    settled = sorted((r["step"], r["status"], r["reason"]) for r in rows if r["event"] == "settled")
    assert settled == [(0, "ok", None), (1, "ok", None), (2, "ok", None),
                       (3, "skipped", "crashed"), (4, "ok", None)]
    resumed = sorted(r["step"] for r in rows if r["event"] == "admitted" and r["resumed"])
    assert resumed == [1, 2]

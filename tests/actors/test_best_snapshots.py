"""The best snapshots through a real supervisor: kept beside the ring, loadable as the weights
of their step after close, listed in best.json; the trainer's checkpoints named, never
deleted; protected_steps while such points are in flight; should_stop from the outcomes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import trio
from transformers import AutoModelForCausalLM

from actorsys import (
    BestPoint,
    CheckpointEvalFn,
    EvalConfig,
    EvalSupervisor,
    MemorySink,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from tests.conftest import snapshot_dirs, tmp_dirs
from tests.fakes import GatedEval, tiny_state_dict
from tests.models import make_model, make_snapshot

pytestmark = pytest.mark.timeout(120)


class ScriptedScore(CheckpointEvalFn):
    """Scores step N as ``scores[N]`` (``eval/acc``)."""

    def __init__(self, scores: dict[int, float]) -> None:
        self.scores = scores

    async def evaluate_checkpoint(
        self, checkpoint_dir: str, input: RolloutFnEvalInput
    ) -> RolloutFnEvalOutput:
        await trio.lowlevel.checkpoint()
        return RolloutFnEvalOutput(data={}, metrics={"eval/acc": self.scores[int(input.rollout_id)]})


def bump(model: torch.nn.Module, step: int) -> dict[str, torch.Tensor]:
    """Change every weight in place for ``step``; return a copy of the weights."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.01 * step)
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


async def test_best_snapshots_survive_close_as_the_weights_of_their_step_and_the_ring_retires_the_rest(
    tmp_path: Path,
) -> None:
    base, staging = tmp_path / "base", tmp_path / "staging"
    model = make_model(base)
    scores = {1: 0.2, 2: 0.9, 3: 0.5, 4: 0.7, 5: 0.1}
    config = EvalConfig(hf_dir=staging, base_checkpoint=base, keep_snapshots=1,
                        best_metric="eval/acc", keep_best=2)
    weights = {}
    async with EvalSupervisor.open(config, eval_fn=ScriptedScore(scores)) as sup:
        for step in scores:
            weights[step] = bump(model, step)
            assert await sup.submit(step, model=model)
            await sup.drain()
        best = sup.best()

    assert best == [BestPoint(2, 0.9, str(staging / "step_2")), BestPoint(4, 0.7, str(staging / "step_4"))]
    assert snapshot_dirs(staging) == ["step_2", "step_4", "step_5"] and tmp_dirs(staging) == []
    assert json.loads((staging / "best.json").read_text()) == [
        {"step": 2, "value": 0.9, "path": str(staging / "step_2")},
        {"step": 4, "value": 0.7, "path": str(staging / "step_4")},
    ]
    for point in best:
        loaded = AutoModelForCausalLM.from_pretrained(point.snapshot).state_dict()
        for name, tensor in weights[point.step].items():
            assert torch.equal(loaded[name], tensor), f"step {point.step}: {name}"
    assert not torch.equal(weights[2]["model.norm.weight"], weights[4]["model.norm.weight"])


async def test_without_a_ring_only_the_best_snapshots_stay(tmp_path: Path) -> None:
    base, staging = tmp_path / "base", tmp_path / "staging"
    model = make_model(base)
    scores = {1: 0.3, 2: 0.1, 3: 0.4}
    config = EvalConfig(hf_dir=staging, base_checkpoint=base, keep_snapshots=0,
                        best_metric="eval/acc", keep_best=1)
    async with EvalSupervisor.open(config, eval_fn=ScriptedScore(scores)) as sup:
        for step in scores:
            await sup.submit(step, model=model)
            await sup.drain()
            assert snapshot_dirs(staging) == [f"step_{step if step != 2 else 1}"]
    assert [p.step for p in sup.best()] == [3]
    assert json.loads((staging / "best.json").read_text())[0]["step"] == 3


async def test_reuse_mode_names_the_trainers_checkpoints_and_deletes_none(tmp_path: Path) -> None:
    base = tmp_path / "base"
    make_model(base)
    for step in (1, 2, 3):
        make_snapshot(base, tmp_path / "ckpt" / str(step), seed=step)
    scores = {1: 0.5, 2: 0.8, 3: 0.6}
    config = EvalConfig(save_hf=str(tmp_path / "ckpt" / "{step}"), keep_snapshots=0,
                        best_metric="eval/acc", keep_best=1)
    async with EvalSupervisor.open(config, eval_fn=ScriptedScore(scores)) as sup:
        for step in scores:
            await sup.submit(step)
            await sup.drain()
        assert sup.protected_steps() == {2}
    assert sup.best() == [BestPoint(2, 0.8, str(tmp_path / "ckpt" / "2"))]
    # The journal of reuse mode lies beside the checkpoints; none of them is touched.
    assert sorted(os.listdir(tmp_path / "ckpt")) == [".actorsys-journal.jsonl", "1", "2", "3"]
    for step in (1, 2, 3):
        assert (tmp_path / "ckpt" / str(step) / "model.safetensors").is_file()


async def test_protected_steps_hold_checkpoint_dir_points_until_they_settle_and_then_the_best(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    base = tmp_path / "base"
    make_model(base)
    for step in (1, 2, 3):
        make_snapshot(base, tmp_path / "ckpt" / str(step), seed=step)
    gated = GatedEval()  # scores step N as N ("score")
    config = EvalConfig(max_in_flight=3, best_metric="score", keep_best=1)
    async with EvalSupervisor.open(config, eval_fn=gated) as sup:
        assert sup.protected_steps() == frozenset()
        for step in (1, 2, 3):
            await sup.submit(step, checkpoint_dir=tmp_path / "ckpt" / str(step))
        await gated.wait_started(1)
        assert sup.protected_steps() == {1, 2, 3}
        gated.release(1)  # one fleet (none): the points are evaluated one at a time
        report = await sup.drain(timeout=5)
        assert report.settled == [1] and sup.protected_steps() == {1, 2, 3}  # 1: the best so far
        gated.release(2)
        report = await sup.drain(timeout=5)
        assert report.settled == [2] and sup.protected_steps() == {2, 3}
        gated.release(3)
        await sup.drain()
        assert sup.protected_steps() == {3} and [p.step for p in sup.best()] == [3]


async def test_should_stop_turns_true_at_the_threshold_and_stays(tmp_path: Path) -> None:
    scores = {1: 0.4, 2: 0.85, 3: 0.1}
    sink = MemorySink()
    config = EvalConfig(hf_dir=tmp_path / "staging", stop_when={"eval/acc": 0.8})
    seen = []
    async with EvalSupervisor.open(config, eval_fn=ScriptedScore(scores), sink=sink) as sup:
        for step in scores:
            await sup.submit(step, state_dict=tiny_state_dict())
            await sup.drain()
            seen.append((sup.should_stop, sup.stop_reason))
    assert [stop for stop, _ in seen] == [False, True, True]
    assert seen[1][1] == seen[2][1] == "step 2 reached eval/acc = 0.85 >= 0.8"
    assert all(o.ok for o in sink.outcomes)


async def test_should_stop_after_patience_points_that_do_not_improve(tmp_path: Path) -> None:
    scores = {1: 0.5, 2: 0.7, 3: 0.6, 4: 0.7, 5: 0.2}
    config = EvalConfig(hf_dir=tmp_path / "staging", best_metric="eval/acc", patience=3)
    seen = []
    async with EvalSupervisor.open(config, eval_fn=ScriptedScore(scores)) as sup:
        for step in scores:
            await sup.submit(step, state_dict=tiny_state_dict())
            await sup.drain()
            seen.append(sup.should_stop)
    assert seen == [False, False, False, False, True]

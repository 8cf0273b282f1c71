"""Supervisor paths a host thread relies on: launch after the supervisor stopped, and a close
that does not wait for evaluations."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import trio

from actorsys import (
    CheckpointEvalFn,
    EvalConfig,
    EvalSupervisor,
    MemorySink,
    RolloutFnEvalInput,
)
from actorsys.snapshot import capture


class Forever(CheckpointEvalFn):
    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:  # noqa: A002
        await trio.sleep_forever()


async def test_launch_after_the_supervisor_gave_up_settles_the_point_crashed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    staging = tmp_path / "staging"
    sink = MemorySink()
    weights = {"w": torch.zeros(4)}
    config = EvalConfig(hf_dir=staging, max_restarts=0)
    async with EvalSupervisor.open(config, eval_fn=Forever(), sink=sink) as sup:
        held = await sup.reserve(1, state_dict=weights)
        doomed = await sup.reserve(2, state_dict=weights)
        assert held is not None
        assert doomed is not None
        shutil.rmtree(staging)  # the exporter cannot make its tmp dir: one crash is too many
        sup.launch(doomed, capture(weights))
        await trio.sleep(1)
        assert sup.statistics().gave_up

        assert sup.launch(held, capture(weights)) is False
    assert sink.by_step()[1].reason == "crashed"


async def test_close_without_drain_cuts_off_at_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    sink = MemorySink()
    async with EvalSupervisor.open(EvalConfig(), eval_fn=Forever(), sink=sink) as sup:
        await sup.submit(3, checkpoint_dir=tmp_path)
        await trio.sleep(1)
        started = trio.current_time()
        report = await sup.aclose(timeout=30, drain=False)
        assert trio.current_time() - started < 1
    assert report.abandoned == [3]
    assert sink.by_step()[3].reason == "closed"

"""Supervisor paths a host thread relies on: launch after the supervisor stopped, and a close
that does not wait for evaluations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing

from actorsys import EvalConfig, EvalSupervisor, Fleet, MemorySink
from actorsys.snapshot import capture
from actorsys.supervisor import SubmitRequest
from tests.fakes import FakeEngine, HangingEval, RecordingEval, tiny_state_dict, written_export


class CrashingFleet(Fleet):
    """A fleet whose pin has a bug: the pinner crashes on every point."""

    def __init__(self) -> None:
        super().__init__([FakeEngine("e")])

    async def pin_and_verify(self, path: str, version: str, **options: Any) -> None:
        raise RuntimeError(f"bug while pinning {version}")


async def test_launch_after_the_supervisor_gave_up_settles_the_point_crashed(
    staging: Path, sink: MemorySink, autojump_clock: trio.testing.MockClock
) -> None:
    weights = tiny_state_dict()
    config = EvalConfig(hf_dir=staging, max_restarts=0)
    async with EvalSupervisor.open(
        config, eval_fn=RecordingEval(), fleet=CrashingFleet(), sink=sink
    ) as sup:
        held = await sup.reserve(SubmitRequest(1, state_dict=weights))  # a host thread is copying these...
        assert held is not None
        await sup.submit(2, export=written_export)  # ...while a crash makes the supervisor give up
        await sup.drain()
        assert sup.statistics().gave_up

        assert sup.launch(held, capture(weights, buffers=held.buffers)) is False
    assert sink.by_step()[1].reason == "crashed"


async def test_close_without_drain_cuts_off_at_once(
    tmp_path: Path, sink: MemorySink, autojump_clock: trio.testing.MockClock
) -> None:
    async with EvalSupervisor.open(EvalConfig(), eval_fn=HangingEval(), sink=sink) as sup:
        await sup.submit(3, checkpoint_dir=tmp_path)
        await trio.sleep(1)
        started = trio.current_time()
        report = await sup.aclose(timeout=30, drain=False)
        assert trio.current_time() - started < 1
    assert report.abandoned == [3]
    assert sink.by_step()[3].reason == "closed"

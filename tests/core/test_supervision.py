"""one_for_one restarts of the pipeline's actors, and giving up past the intensity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actorsys import (
    ActorsysError,
    EvalConfig,
    EvalSupervisor,
    Fleet,
    MemorySink,
    SupervisorGaveUpError,
)
from tests.fakes import FakeEngine, RecordingEval, written_export


class BuggyFleet(Fleet):
    """A fleet whose pin has a bug (raises something no pin should): the pinner crashes."""

    def __init__(self, failures: int) -> None:
        super().__init__([FakeEngine("e")])
        self.failures = failures

    async def pin_and_verify(self, path: str, version: str, **options: Any) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError(f"bug while pinning {version}")
        await super().pin_and_verify(path, version, **options)



async def test_crashed_actor_is_restarted_and_its_point_settles_crashed(
    staging: Path, sink: MemorySink
) -> None:
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=RecordingEval(),
                                   fleet=BuggyFleet(failures=1), sink=sink) as sup:
        await sup.submit(1, export=written_export)
        await sup.drain()
        await sup.submit(2, export=written_export)
        await sup.drain()
        stats = sup.statistics()
    first = sink.by_step()[1]
    assert first.reason == "crashed" and "bug while pinning 1" in first.data["error"]
    assert sink.by_step()[2].ok
    assert stats.restarts == 1 and not stats.gave_up
    assert sorted(p.name for p in staging.iterdir()) == ["journal.jsonl", "step_2"]


async def test_supervisor_gives_up_past_max_restarts_then_submit_raises_and_reports_still_return(
    staging: Path, sink: MemorySink, autojump_clock: trio.testing.MockClock
) -> None:
    # A period no clock jump can pass: a worker thread that does not hold the autojump clock
    # lets it jump to the next deadline, which on a busy machine could end a 60 s window.
    config = EvalConfig(hf_dir=staging, max_restarts=3, restart_period=1e9)
    async with EvalSupervisor.open(config, eval_fn=RecordingEval(), fleet=BuggyFleet(failures=99),
                                   sink=sink) as sup:
        for step in range(1, 5):
            await sup.submit(step, export=written_export)
            await sup.drain()
        stats = sup.statistics()
        assert stats.gave_up and stats.restarts == 3
        with pytest.raises(SupervisorGaveUpError) as caught:
            await sup.submit(5, export=written_export)
        assert isinstance(caught.value, ActorsysError)
        assert isinstance(caught.value.__cause__, RuntimeError)
        drained = await sup.drain(timeout=1)
        closed = await sup.aclose(timeout=1)
    assert [(o.step, o.reason) for o in sink.outcomes] == [(s, "crashed") for s in range(1, 5)]
    assert drained.pending == [] and not closed.clean
    assert [p.name for p in staging.iterdir()] == ["journal.jsonl"]


async def test_points_in_flight_when_the_supervisor_gives_up_settle_crashed(
    staging: Path, sink: MemorySink
) -> None:
    config = EvalConfig(hf_dir=staging, max_restarts=0, max_in_flight=3)
    gate = trio.Event()

    async def slow_export(step: int, path: str) -> None:
        await gate.wait()
        await written_export(step, path)

    async with EvalSupervisor.open(config, eval_fn=RecordingEval(), fleet=BuggyFleet(failures=99),
                                   sink=sink) as sup:
        await sup.submit(1, export=written_export)
        await sup.submit(2, export=slow_export)
        await sup.submit(3, export=slow_export)
        await sup.drain()
        gate.set()
        assert sup.statistics().gave_up
    assert sorted((o.step, o.reason) for o in sink.outcomes) == [(s, "crashed") for s in (1, 2, 3)]
    assert [p.name for p in staging.iterdir()] == ["journal.jsonl"]


async def test_crashes_spread_beyond_the_restart_period_never_give_up(
    staging: Path, sink: MemorySink, autojump_clock: trio.testing.MockClock
) -> None:
    config = EvalConfig(hf_dir=staging, max_restarts=1, restart_period=10)
    async with EvalSupervisor.open(config, eval_fn=RecordingEval(), fleet=BuggyFleet(failures=3),
                                   sink=sink) as sup:
        for step in range(1, 5):
            await sup.submit(step, export=written_export)
            await sup.drain()
            await trio.sleep(11)
        assert not sup.statistics().gave_up and sup.statistics().restarts == 3
    assert [o.reason for o in sink.outcomes] == ["crashed", "crashed", "crashed", None]


class FailingSink:
    def __init__(self) -> None:
        self.calls = 0

    def record(self, outcome: object) -> None:
        self.calls += 1
        raise OSError("disk full")


async def test_a_failing_sink_never_crashes_the_pipeline(staging: Path) -> None:
    sink = FailingSink()
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=RecordingEval(), sink=sink) as sup:
        await sup.submit(1, export=written_export)
        await sup.submit(2, export=written_export)
        await sup.drain()
        stats = sup.statistics()
    assert sink.calls == 2 and stats.ok == 2 and stats.restarts == 0

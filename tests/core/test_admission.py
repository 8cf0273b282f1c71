"""Admission: max_in_flight and the three overflow policies; force never drops."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from actorsys import EvalConfig, EvalSupervisor, MemorySink
from tests.fakes import GatedEval, RecordingEval, tiny_state_dict, written_export


async def test_backpressure_submit_waits_until_the_oldest_point_settles(
    staging: Path, sink: MemorySink
) -> None:
    eval_fn = GatedEval()
    config = EvalConfig(hf_dir=staging, max_in_flight=2)
    async with EvalSupervisor.open(config, eval_fn=eval_fn, sink=sink) as sup:
        await sup.submit(1, state_dict=tiny_state_dict())
        await sup.submit(2, state_dict=tiny_state_dict())
        admitted = trio.Event()

        async def third() -> None:
            await sup.submit(3, state_dict=tiny_state_dict())
            admitted.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(third)
            await trio.testing.wait_all_tasks_blocked()
            assert not admitted.is_set() and sup.statistics().in_flight == 2
            eval_fn.release(1)
            await admitted.wait()
        eval_fn.release(2)
        eval_fn.release(3)
        await sup.drain()
    assert [o.step for o in sink.outcomes] == [1, 2, 3]
    assert all(o.ok for o in sink.outcomes)


async def test_cancelled_backpressure_wait_admits_nothing(staging: Path, sink: MemorySink) -> None:
    eval_fn = GatedEval()
    config = EvalConfig(hf_dir=staging, max_in_flight=1)
    async with EvalSupervisor.open(config, eval_fn=eval_fn, sink=sink) as sup:
        await sup.submit(1, state_dict=tiny_state_dict())
        with trio.move_on_after(0.01) as waited:
            await sup.submit(2, state_dict=tiny_state_dict())
        assert waited.cancelled_caught
        eval_fn.release(1)
        eval_fn.release(2)
        await sup.submit(2, state_dict=tiny_state_dict())
        await sup.drain()
    assert [(o.step, o.status) for o in sink.outcomes] == [(1, "ok"), (2, "ok")]


async def test_skip_policy_settles_busy_before_any_export(staging: Path, sink: MemorySink) -> None:
    eval_fn = GatedEval()
    config = EvalConfig(hf_dir=staging, max_in_flight=1, overflow="skip")
    async with EvalSupervisor.open(config, eval_fn=eval_fn, sink=sink) as sup:
        await sup.submit(1, state_dict=tiny_state_dict())
        exported: list[int] = []

        async def export(step: int, path: str) -> None:
            exported.append(step)

        assert not await sup.submit(2, export=export)
        assert sink.outcomes[-1].step == 2 and sink.outcomes[-1].reason == "busy"
        assert exported == []
        eval_fn.release(1)
    assert sup.statistics().skipped_by_reason == {"busy": 1}


async def test_force_never_drops_it_waits_instead(staging: Path, sink: MemorySink) -> None:
    eval_fn = GatedEval()
    config = EvalConfig(hf_dir=staging, max_in_flight=1, overflow="skip")
    async with EvalSupervisor.open(config, eval_fn=eval_fn, sink=sink) as sup:
        await sup.submit(1, state_dict=tiny_state_dict())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: sup.submit(2, state_dict=tiny_state_dict(), force=True))
            await trio.testing.wait_all_tasks_blocked()
            assert [o.step for o in sink.outcomes] == []
            eval_fn.release(1)
        eval_fn.release(2)
        await sup.drain()
    assert [(o.step, o.status) for o in sink.outcomes] == [(1, "ok"), (2, "ok")]


async def test_latest_supersedes_queued_points_not_yet_pinned(staging: Path, sink: MemorySink) -> None:
    eval_fn = GatedEval()
    config = EvalConfig(hf_dir=staging, max_in_flight=2, overflow="latest")
    async with EvalSupervisor.open(config, eval_fn=eval_fn, sink=sink) as sup:
        await sup.submit(1, state_dict=tiny_state_dict())
        await eval_fn.wait_started(1)
        await sup.submit(2, state_dict=tiny_state_dict())
        await sup.submit(3, state_dict=tiny_state_dict())
        assert [(o.step, o.reason) for o in sink.outcomes] == [(2, "superseded")]
        for step in (1, 3):
            eval_fn.release(step)
        await sup.drain()
    assert [(o.step, o.status) for o in sink.outcomes][1:] == [(1, "ok"), (3, "ok")]
    assert eval_fn.started == [1, 3]
    assert sorted(p.name for p in staging.iterdir()) == ["journal.jsonl", "step_1", "step_3"]


async def test_latest_never_supersedes_a_forced_point(staging: Path, sink: MemorySink) -> None:
    eval_fn = GatedEval()
    config = EvalConfig(hf_dir=staging, max_in_flight=2, overflow="latest")
    async with EvalSupervisor.open(config, eval_fn=eval_fn, sink=sink) as sup:
        await sup.submit(1, state_dict=tiny_state_dict())
        await eval_fn.wait_started(1)
        await sup.submit(2, state_dict=tiny_state_dict(), force=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: sup.submit(3, state_dict=tiny_state_dict()))
            await trio.testing.wait_all_tasks_blocked()
            assert sink.outcomes == []
            eval_fn.release(1)
        eval_fn.release(2)
        eval_fn.release(3)
        await sup.drain()
    assert [(o.step, o.status) for o in sink.outcomes] == [(1, "ok"), (2, "ok"), (3, "ok")]


async def test_in_flight_never_exceeds_max_in_flight(staging: Path, sink: MemorySink) -> None:
    eval_fn = GatedEval()
    config = EvalConfig(hf_dir=staging, max_in_flight=3)
    peak = 0
    async with EvalSupervisor.open(config, eval_fn=eval_fn, sink=sink) as sup:
        async with trio.open_nursery() as nursery:
            async def submit_all() -> None:
                nonlocal peak
                for step in range(8):
                    await sup.submit(step, state_dict=tiny_state_dict())
                    peak = max(peak, sup.statistics().in_flight)

            nursery.start_soon(submit_all)
            for step in range(8):
                await trio.testing.wait_all_tasks_blocked()
                eval_fn.release(step)
        await sup.drain()
    assert peak == 3 and len(sink.outcomes) == 8


async def test_latest_supersedes_a_point_waiting_behind_a_forced_export_at_once(
    staging: Path, sink: MemorySink
) -> None:
    gate = trio.Event()

    async def slow_export(step: int, path: str) -> None:
        await gate.wait()
        await written_export(step, path)

    config = EvalConfig(hf_dir=staging, max_in_flight=2, overflow="latest")
    async with EvalSupervisor.open(config, eval_fn=RecordingEval(), sink=sink) as sup:
        await sup.submit(1, export=slow_export, force=True)
        await sup.submit(2, export=written_export)
        await sup.submit(3, export=written_export)
        assert [(o.step, o.reason) for o in sink.outcomes] == [(2, "superseded")]
        gate.set()
        await sup.drain()
    assert [(o.step, o.status) for o in sink.outcomes][1:] == [(1, "ok"), (3, "ok")]

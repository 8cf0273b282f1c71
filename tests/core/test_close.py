"""drain and aclose are bounded whatever the evaluation does, and never raise on timeout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actorsys import (
    CheckpointEvalFn,
    EvalConfig,
    EvalSupervisor,
    MemorySink,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from tests.conftest import snapshot_dirs, tmp_dirs
from tests.fakes import (
    GatedEval,
    HangingEval,
    HelperHangingEval,
    ThreadHangingEval,
    tiny_state_dict,
    written_export,
)


async def test_close_is_bounded_when_a_trio_eval_never_returns(
    staging: Path, sink: MemorySink, autojump_clock: trio.testing.MockClock
) -> None:
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=HangingEval(), sink=sink) as sup:
        await sup.submit(1, export=written_export)
        report = await sup.aclose(timeout=5)
        assert trio.current_time() <= 5
    assert report.abandoned == [1] and not report.clean
    assert [(o.step, o.reason) for o in sink.outcomes] == [(1, "closed")]
    assert snapshot_dirs(staging) == [] and tmp_dirs(staging) == []


@pytest.mark.parametrize(
    ("make_eval", "stuck"),
    [(ThreadHangingEval, "eval of step 1"), (HelperHangingEval, "scoring")],
    ids=["thread-eval", "eval-fn-helper-thread"],
)
async def test_close_is_bounded_when_eval_thread_hangs(
    staging: Path,
    sink: MemorySink,
    autojump_clock: trio.testing.MockClock,
    make_eval: type[ThreadHangingEval | HelperHangingEval],
    stuck: str,
) -> None:
    eval_fn = make_eval()
    try:
        async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=eval_fn, sink=sink) as sup:
            await sup.submit(1, export=written_export)
            report = await sup.aclose(timeout=5)
            assert trio.current_time() <= 5
    finally:
        eval_fn.unblock.set()
    assert report.abandoned == [1]
    assert report.stuck_threads == [stuck]
    assert sink.outcomes[0].reason == "closed"


async def test_close_during_export_removes_the_partial_dir(
    staging: Path, sink: MemorySink, autojump_clock: trio.testing.MockClock
) -> None:
    async def stuck_export(step: int, path: str) -> None:
        Path(path, "model.safetensors").write_bytes(b"partial")
        await trio.sleep_forever()

    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=HangingEval(), sink=sink) as sup:
        await sup.submit(1, export=stuck_export)
        report = await sup.aclose(timeout=3)
    assert report.abandoned == [1] and sink.outcomes[0].reason == "closed"
    assert [p.name for p in staging.iterdir()] == ["journal.jsonl"]


async def test_close_lets_in_flight_points_finish_within_the_budget(
    staging: Path, sink: MemorySink, autojump_clock: trio.testing.MockClock
) -> None:
    class Slow(CheckpointEvalFn):
        async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
            await trio.sleep(4)
            return RolloutFnEvalOutput(data={})

    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=Slow(), sink=sink) as sup:
        await sup.submit(1, export=written_export)
        report = await sup.aclose(timeout=10)
    assert report.clean and report.abandoned == []
    assert sink.outcomes[0].ok and trio.current_time() == pytest.approx(4)


async def test_leaving_the_block_closes_within_close_timeout(
    staging: Path, sink: MemorySink, autojump_clock: trio.testing.MockClock
) -> None:
    config = EvalConfig(hf_dir=staging, close_timeout=8)
    async with EvalSupervisor.open(config, eval_fn=HangingEval(), sink=sink) as sup:
        await sup.submit(1, export=written_export)
    assert trio.current_time() <= 8
    assert sink.outcomes[0].reason == "closed"
    assert sup.statistics().closed


async def test_close_is_idempotent_and_returns_the_same_report(
    staging: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=HangingEval()) as sup:
        await sup.submit(1, export=written_export)
        first = await sup.aclose(timeout=2)
        second = await sup.aclose(timeout=2)
    assert first is second and first.abandoned == [1]


async def test_close_runs_to_its_budget_even_when_the_caller_is_cancelled(
    staging: Path, sink: MemorySink, autojump_clock: trio.testing.MockClock
) -> None:
    eval_fn = GatedEval()
    with trio.move_on_after(1):
        async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=eval_fn, sink=sink) as sup:
            await sup.submit(1, export=written_export)
            await eval_fn.wait_started(1)
            await trio.sleep_forever()
    assert [(o.step, o.reason) for o in sink.outcomes] == [(1, "closed")]
    assert trio.current_time() <= 1 + 30


async def test_drain_is_bounded_and_reports_what_is_pending(
    staging: Path, autojump_clock: trio.testing.MockClock
) -> None:
    eval_fn = GatedEval()
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=eval_fn) as sup:
        await sup.submit(1, export=written_export)
        await sup.submit(2, export=written_export)
        eval_fn.release(1)
        report = await sup.drain(timeout=15)
        assert trio.current_time() == pytest.approx(15)
        assert (report.settled, report.pending) == ([1], [2])
        eval_fn.release(2)
        assert (await sup.drain()).settled == [2]


class Disposable(GatedEval):
    def __init__(self) -> None:
        super().__init__()
        self.disposed = 0

    def dispose(self) -> None:
        self.disposed += 1


async def test_eval_fn_is_disposed_once_at_close(staging: Path) -> None:
    eval_fn = Disposable()
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=eval_fn) as sup:
        await sup.submit(1, state_dict=tiny_state_dict())
        eval_fn.release(1)
        await sup.aclose()
    assert eval_fn.disposed == 1


async def test_submit_waiting_for_a_slot_is_refused_when_close_begins(
    staging: Path, autojump_clock: trio.testing.MockClock
) -> None:
    from actorsys import SupervisorClosedError

    refused = trio.Event()
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging, max_in_flight=1), eval_fn=HangingEval()) as sup:
        await sup.submit(1, export=written_export)

        async def waiting_submit() -> None:
            with pytest.raises(SupervisorClosedError):
                await sup.submit(2, export=written_export)
            refused.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiting_submit)
            await trio.testing.wait_all_tasks_blocked()
            report = await sup.aclose(timeout=2)
        assert refused.is_set() and report.abandoned == [1]

"""EvalRunner: skips, crashes, deadlines, and the three runtimes of an eval fn."""

from __future__ import annotations

import asyncio
import threading
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
from tests.fakes import HangingEval, SkippingEval, ThreadHangingEval, written_export


async def run_one(staging: Path, eval_fn: Any, **config: Any) -> MemorySink:
    sink = MemorySink()
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging, **config), eval_fn=eval_fn,
                                   sink=sink) as sup:
        await sup.submit(1, export=written_export)
        await sup.drain()
    return sink


async def test_eval_skip_settles_with_the_eval_fns_reason(staging: Path) -> None:
    sink = await run_one(staging, SkippingEval("no_data"))
    outcome = sink.outcomes[0]
    assert (outcome.status, outcome.reason, outcome.data) == ("skipped", "no_data", {"error": "told to"})


class Crashing(CheckpointEvalFn):
    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        raise ZeroDivisionError("bad metric")


async def test_eval_exception_settles_crashed_and_the_pipeline_goes_on(staging: Path) -> None:
    sink = await run_one(staging, Crashing())
    outcome = sink.outcomes[0]
    assert outcome.reason == "crashed" and "ZeroDivisionError: bad metric" in outcome.data["error"]


class WrongReturn(CheckpointEvalFn):
    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        return 0.5


async def test_eval_returning_the_wrong_type_is_crashed_with_the_reason(staging: Path) -> None:
    outcome = (await run_one(staging, WrongReturn())).outcomes[0]
    assert outcome.reason == "crashed" and "RolloutFnEvalOutput" in outcome.data["error"]


class DictReturn(CheckpointEvalFn):
    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        return {"gsm8k": {"acc": 0.5}}


async def test_eval_returning_a_dict_is_taken_as_its_data(staging: Path) -> None:
    outcome = (await run_one(staging, DictReturn())).outcomes[0]
    assert outcome.ok and outcome.data == {"gsm8k": {"acc": 0.5}}


async def test_eval_timeout_settles_timeout_at_the_deadline(
    staging: Path, autojump_clock: trio.testing.MockClock
) -> None:
    outcome = (await run_one(staging, HangingEval(), eval_timeout=120)).outcomes[0]
    assert outcome.reason == "timeout"
    assert outcome.metrics["eval/duration_seconds"] == pytest.approx(120)


class Metrics(CheckpointEvalFn):
    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        await trio.sleep(7)
        return RolloutFnEvalOutput(data={}, metrics={"eval/acc": 0.75})


async def test_outcome_carries_the_eval_metrics_and_ours(
    staging: Path, autojump_clock: trio.testing.MockClock
) -> None:
    sink = MemorySink()
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=Metrics(), sink=sink) as sup:
        await sup.submit(10, export=written_export)
        sup.note_step(14)
        await sup.drain()
    metrics = sink.outcomes[0].metrics
    assert metrics["eval/acc"] == 0.75
    assert metrics["eval/lag_steps"] == 4
    assert metrics["eval/duration_seconds"] == pytest.approx(7)
    assert {"eval/export_time_seconds", "eval/pin_time_seconds"} <= metrics.keys()


class AsyncioEval(CheckpointEvalFn):
    runtime = "asyncio"

    def __init__(self) -> None:
        self.loop_thread: str | None = None
        self.cancelled = threading.Event()

    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        self.loop_thread = threading.current_thread().name
        assert asyncio.get_running_loop() is not None
        await asyncio.sleep(0)
        return RolloutFnEvalOutput(data={"step": input.rollout_id})


async def test_asyncio_eval_runs_on_a_private_loop_in_its_own_thread(staging: Path) -> None:
    eval_fn = AsyncioEval()
    outcome = (await run_one(staging, eval_fn)).outcomes[0]
    assert outcome.ok and outcome.data == {"step": 1}
    assert eval_fn.loop_thread == "actorsys-asyncio"


class AsyncioForever(CheckpointEvalFn):
    runtime = "asyncio"

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


async def test_asyncio_eval_is_cancelled_when_its_deadline_passes(staging: Path) -> None:
    eval_fn = AsyncioForever()
    outcome = (await run_one(staging, eval_fn, eval_timeout=0.05)).outcomes[0]
    assert outcome.reason == "timeout"
    assert await trio.to_thread.run_sync(eval_fn.cancelled.wait, 5)


class ThreadEval(CheckpointEvalFn):
    runtime = "thread"

    def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        return RolloutFnEvalOutput(data={"thread": threading.current_thread().name != "MainThread"})


async def test_thread_eval_runs_in_a_worker_thread(staging: Path) -> None:
    outcome = (await run_one(staging, ThreadEval())).outcomes[0]
    assert outcome.ok and outcome.data == {"thread": True}


async def test_thread_eval_past_its_deadline_is_abandoned_not_waited_for(staging: Path) -> None:
    eval_fn = ThreadHangingEval()
    sink = MemorySink()
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging, eval_timeout=0.05), eval_fn=eval_fn,
                                   sink=sink) as sup:
        await sup.submit(1, export=written_export)
        await sup.drain()
        assert sink.outcomes[0].reason == "timeout"
        report = await sup.aclose(timeout=1)
    eval_fn.unblock.set()
    assert report.stuck_threads == ["eval of step 1"] and not report.clean


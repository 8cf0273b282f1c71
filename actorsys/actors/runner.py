"""EvalRunner: runs the eval fn on a pinned fleet, one evaluation per fleet at a time."""

from __future__ import annotations

import math
from typing import Any

import trio

from actorsys._pipeline import Pipeline
from actorsys._point import Point, Stage
from actorsys.contracts import EvalSkip, RolloutFnEvalInput, RolloutFnEvalOutput
from actorsys.outcome import DURATION_SECONDS
from actorsys.runtime import AsyncioThread, run_blocking

NAME = "runner"


class EvalInvoker:
    """Calls ``eval_fn.evaluate_checkpoint`` the way its ``runtime`` asks for."""

    def __init__(self, eval_fn: Any, pipeline: Pipeline) -> None:
        self.eval_fn = eval_fn
        self.runtime: str = getattr(eval_fn, "runtime", "trio")
        self.pipeline = pipeline
        self.asyncio_thread = AsyncioThread()
        self.limiter = trio.CapacityLimiter(64)

    async def __call__(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:  # noqa: A002
        evaluate = self.eval_fn.evaluate_checkpoint
        if self.runtime == "asyncio":
            return await self.asyncio_thread.run(evaluate(checkpoint_dir, input))
        if self.runtime == "thread":
            return await run_blocking(
                lambda: evaluate(checkpoint_dir, input),
                abandon_on_cancel=True,
                limiter=self.limiter,
                description=f"eval of step {input.rollout_id}",
                tracker=self.pipeline.tracker,
            )
        return await evaluate(checkpoint_dir, input)


async def run_runner(
    pipeline: Pipeline,
    inbox: trio.MemoryReceiveChannel[Point],
    onward: trio.MemorySendChannel[Point],
    invoke: EvalInvoker,
) -> None:
    async with inbox, onward, trio.open_nursery() as nursery:
        async for point in inbox:
            if point.drop_reason is not None:
                continue
            nursery.start_soon(_evaluate, pipeline, point, onward, invoke)


async def _evaluate(
    pipeline: Pipeline,
    point: Point,
    onward: trio.MemorySendChannel[Point],
    invoke: EvalInvoker,
) -> None:
    if point.drop_reason is not None:
        # Dropped between its hand-over and the start of this task: whoever dropped it has
        # already sent it to settle.
        return
    timeout = pipeline.config.eval_timeout
    with pipeline.hold(point, NAME):
        started = trio.current_time()
        try:
            with trio.move_on_after(math.inf if timeout is None else timeout) as deadline:
                await _run_eval(pipeline, point, invoke)
            if deadline.cancelled_caught:
                pipeline.fail(point, "timeout", f"eval took longer than {timeout} s")
        finally:
            point.metrics[DURATION_SECONDS] = trio.current_time() - started
    pipeline.return_fleet(point)
    pipeline.release(point, onward, Stage.SETTLE)


async def _run_eval(pipeline: Pipeline, point: Point, invoke: EvalInvoker) -> None:
    assert point.snapshot is not None
    eval_input = RolloutFnEvalInput(
        rollout_id=point.step,
        weight_version=point.weight_version,
        hf_dir=point.snapshot,
        fleet=point.fleet,
    )
    try:
        result = await invoke(point.snapshot, eval_input)
    except EvalSkip as skip:
        pipeline.fail(point, skip.reason, skip.detail)
        return
    except Exception as exc:
        pipeline.fail(point, "crashed", f"eval fn raised {type(exc).__name__}: {exc}")
        return
    if isinstance(result, dict):
        result = RolloutFnEvalOutput(data=result)
    if not isinstance(result, RolloutFnEvalOutput):
        pipeline.fail(
            point, "crashed", f"eval fn returned {type(result).__name__}, not RolloutFnEvalOutput"
        )
        return
    point.output = result

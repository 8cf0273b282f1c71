"""EvalRunner: runs the eval fn on each pinned point at once, one task per point.

Concurrency is bounded by the fleets: a point arrives here only with a fleet the pinner lent
it. The evaluation starts as soon as the point arrives; its result stands only once the pin's
verdict (``FleetLease.verdict``, settled by the pinner within the pin deadline) is clean: a
mismatch discards the scores as ``pin_violation``. The runner then sends the fleet back over the
fleet pool's channel and hands the point to the Retirer.

A ``served`` point (a shared fleet, the trainer's own engines) has no snapshot: the eval fn
gets ``checkpoint_dir=None`` (and ``input.base_checkpoint`` for the model's tokenizer and
config). Before it settles every engine's version is read again: a version that changed
during the evaluation (an update outside ``weight_update``) is ``pin_violation``, and the
scores are discarded.
"""

from __future__ import annotations

import os
from typing import Any

import trio

from actorsys.actors.flight import Flight
from actorsys.actors.pinner import FleetReturns, give_back
from actorsys.actors.point import Point, Source, State, Ticket
from actorsys.actors.retirer import Retirer
from actorsys.actors.stage import Done, Result, Skip, Stage, within
from actorsys.config import EvalConfig
from actorsys.contracts import EvalSkip, RolloutFnEvalInput, RolloutFnEvalOutput
from actorsys.fleet import PinError
from actorsys.outcome import DURATION_SECONDS
from actorsys.runtime import (
    AsyncioThread,
    EvalThreads,
    ThreadTracker,
    evaluating_with,
    run_blocking,
)

NAME = "runner"
VERSION_READ_TIMEOUT = 30.0
"""Seconds the versions of a shared fleet may take to read again before a point settles."""


class EvalInvoker:
    """Calls ``eval_fn.evaluate_checkpoint`` the way its ``runtime`` asks for."""

    def __init__(self, eval_fn: Any, tracker: ThreadTracker) -> None:
        self.eval_fn = eval_fn
        self.runtime: str = getattr(eval_fn, "runtime", "trio")
        self.tracker = tracker
        self.asyncio_thread = AsyncioThread()
        self.limiter = trio.CapacityLimiter(64)
        self.threads = EvalThreads(tracker, self.limiter)

    async def __call__(self, checkpoint_dir: str | None, input: RolloutFnEvalInput) -> Any:  # noqa: A002
        evaluate = self.eval_fn.evaluate_checkpoint
        if self.runtime == "asyncio":
            return await self.asyncio_thread.run(evaluate(checkpoint_dir, input))
        if self.runtime == "thread":
            return await run_blocking(
                lambda: evaluate(checkpoint_dir, input),
                abandon_on_cancel=True,
                limiter=self.limiter,
                description=f"eval of step {input.rollout_id}",
                tracker=self.tracker,
                hold_clock=False,
            )
        with evaluating_with(self.threads):
            return await evaluate(checkpoint_dir, input)


class EvalRunner(Stage):
    name = NAME
    state = State.EVAL
    metric = DURATION_SECONDS

    def __init__(
        self,
        config: EvalConfig,
        flight: Flight,
        retirer: Retirer,
        fleet_returns: FleetReturns,
        invoke: EvalInvoker,
    ) -> None:
        super().__init__(flight, retirer)
        self.config = config
        self.fleet_returns = fleet_returns
        self.invoke = invoke

    async def run(self, inbox: trio.MemoryReceiveChannel[Point]) -> None:
        async with inbox, trio.open_nursery() as nursery:
            async for point in inbox:
                if self.take(point) is not None:
                    nursery.start_soon(self.process, point)

    def pass_on(self, ticket: Ticket, point: Point) -> None:
        self.retirer.take(ticket, point)

    def leave(self, point: Point, *, done: bool) -> Point:
        return give_back(point, self.fleet_returns)

    async def work(self, point: Point) -> Result:
        timeout = self.config.eval_timeout
        result: Result = Skip("timeout", f"eval took longer than {timeout} s")
        with within(timeout):
            result = await self._run_eval(point)
        verdict = point.lease.verdict if point.lease is not None else None
        if verdict is not None:
            try:
                await verdict.wait()
            except PinError as exc:
                return Skip(exc.reason, f"{exc} (the evaluation's result is discarded)")
            if isinstance(result, Done) and point.source is Source.SERVED:
                changed = await self._version_changed(point)
                if changed is not None:
                    return changed
            if verdict.unverified is not None and isinstance(result, Done):
                output = result.point.output
                assert output is not None
                noted = RolloutFnEvalOutput(verdict.annotate(output.data), output.metrics)
                return Done(result.point.but(output=noted))
        return result

    async def _version_changed(self, point: Point) -> Skip | None:
        """The skip of a served point whose shared fleet no longer serves its version."""
        assert point.lease is not None and point.lease.fleet is not None
        try:
            with trio.fail_after(VERSION_READ_TIMEOUT):
                await point.lease.fleet.check_still_serving()
        except PinError as exc:
            return Skip(exc.reason, f"{exc} (the evaluation's result is discarded)")
        except trio.TooSlowError:
            return Skip("unhealthy", f"the shared fleet's versions could not be read again "
                        f"within {VERSION_READ_TIMEOUT} s (the evaluation's result is discarded)")
        return None

    async def _run_eval(self, point: Point) -> Result:
        assert point.lease is not None
        assert point.snapshot is not None or point.source is Source.SERVED
        base = self.config.base_checkpoint
        eval_input = RolloutFnEvalInput(
            rollout_id=point.step,
            weight_version=point.weight_version,
            hf_dir=point.snapshot,
            fleet=point.lease.fleet,
            base_checkpoint=None if base is None else os.fspath(base),
        )
        try:
            result = await self.invoke(point.snapshot, eval_input)
        except EvalSkip as skip:
            return Skip(skip.reason, skip.detail)
        except Exception as exc:
            return Skip("crashed", f"eval fn raised {type(exc).__name__}: {exc}")
        if isinstance(result, dict):
            result = RolloutFnEvalOutput(data=result)
        if not isinstance(result, RolloutFnEvalOutput):
            kind = type(result).__name__
            return Skip("crashed", f"eval fn returned {kind}, not RolloutFnEvalOutput")
        return Done(point.but(output=result))


"""Drain and close: waiting for the points in flight, and stopping within a budget.

A close first lets the points in flight settle through the Retirer, for all but a reserve of
its budget; only what is still in flight then is settled ``closed`` here, outside the Retirer
(its owners are cancelled, and whatever they forward later is only cleaned up). Then the
actors stop in pipeline order, the files left to delete are deleted, the buffer pool's
preparations are stopped and waited for, the eval fn is disposed and the asyncio eval loop
stopped. What still runs then is named in ``stuck_threads``: a thread of ours still inside
torch when the interpreter finalizes can abort the process.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import trio

from actorsys._core.collective.contribution import Contribution
from actorsys._core.wiring import Wiring
from actorsys.actors.point import State
from actorsys.actors.stage import within
from actorsys.contracts import CheckpointEvalFn
from actorsys.outcome import CloseReport, DrainReport
from actorsys.runtime import ThreadTracker, run_blocking
from actorsys.runtime.asyncio_thread import DESCRIPTION as ASYNCIO_LOOP

log = logging.getLogger("actorsys")

CLOSE_RESERVE_FRACTION = 0.1
CLOSE_RESERVE_MAX = 1.0
ASYNCIO_STOP_SECONDS = 0.2


def waiting_on(wiring: Wiring, steps: list[int] | None = None) -> bool:
    """Whether any of ``steps`` (default: every point) is still in flight: not settled, or
    settled with files still to delete while the Retirer runs."""
    gave_up = wiring.admission.gave_up is not None
    for ticket in wiring.flight:
        if steps is not None and ticket.step not in steps:
            continue
        if ticket.state is not State.SETTLED or not gave_up:
            return True
    return False


async def drain(wiring: Wiring, timeout: float | None) -> DrainReport:  # noqa: ASYNC109 - a budget
    waiting = wiring.flight.unsettled()
    await trio.lowlevel.checkpoint()
    with within(timeout):
        while waiting_on(wiring, waiting):
            await wiring.flight.wait_changed()
    settled = wiring.retirer.settled_steps
    return DrainReport(
        settled=[s for s in waiting if s in settled],
        pending=[s for s in waiting if s not in settled],
    )


class Closer:
    """Closes a supervisor once; every later call waits for that close and returns its report."""

    def __init__(self) -> None:
        self._report: CloseReport | None = None
        self._done = trio.Event()

    async def close_once(
        self, wiring: Wiring, eval_fn: Any, budget: float, drain: bool
    ) -> CloseReport:
        """Shielded from outer cancellation: it runs to completion within its own budget."""
        if wiring.admission.closing:
            await self._done.wait()
            assert self._report is not None
            return self._report
        wiring.admission.closing = True
        if wiring.admission.disk is not None:
            wiring.admission.disk.stop()
        with trio.CancelScope(shield=True):
            deadline = trio.current_time() + budget
            report = self._report = await close(wiring, eval_fn, deadline, budget, drain)
        self._done.set()
        return report

    async def close_contributing(
        self, wiring: Wiring, eval_fn: Any, contribution: Contribution, budget: float, drain: bool
    ) -> CloseReport:
        """A contributing rank: its shard writes get the budget but a reserve, then the
        (idle) pipeline closes."""
        deadline = trio.current_time() + budget
        share = budget * (1 - CLOSE_RESERVE_FRACTION) if drain else 0.0
        abandoned = await contribution.aclose(share)
        rest = max(0.0, deadline - trio.current_time())
        report = await self.close_once(wiring, eval_fn, rest, drain)
        return CloseReport(
            clean=report.clean and not abandoned,
            abandoned=sorted({*report.abandoned, *abandoned}),
            stuck_threads=report.stuck_threads,
        )


async def close(
    wiring: Wiring, eval_fn: Any, deadline: float, budget: float, drain: bool
) -> CloseReport:
    flight, actors, retirer = wiring.flight, wiring.actors, wiring.retirer
    flight.wake()
    reserve = min(CLOSE_RESERVE_MAX, budget * CLOSE_RESERVE_FRACTION)
    with trio.move_on_at(deadline - reserve):
        while drain and waiting_on(wiring):
            await flight.wait_changed()
    abandoned = retirer.settle_now("closed", "abandoned at close")
    with trio.move_on_at(deadline):
        await actors.shutdown()
    actors.cancel()
    await retirer.delete_leftovers()
    await close_buffers(wiring, deadline)
    await dispose(eval_fn, deadline, wiring)
    asyncio_thread = wiring.invoker.asyncio_thread
    asyncio_thread.stop(timeout=max(0.0, min(ASYNCIO_STOP_SECONDS, deadline - trio.current_time())))
    stuck = [*wiring.tracker.running(), *wiring.buffers.unfinished()]
    if asyncio_thread.running:
        stuck.append(ASYNCIO_LOOP)
    clean = not abandoned and not stuck and wiring.admission.gave_up is None
    log.info("closed: %d abandoned, %d stuck threads", len(abandoned), len(stuck))
    return CloseReport(clean=clean, abandoned=abandoned, stuck_threads=stuck)


async def close_buffers(wiring: Wiring, deadline: float) -> None:
    """Close the buffer pool: its preparations stop within a chunk of faulting in; wait for
    them (in a worker thread) until ``deadline`` at most. Those still running then are the
    pool's to name (``unfinished``)."""
    if wiring.buffers.close():
        return
    left = deadline - trio.current_time()
    if left <= 0:
        return
    await run_blocking(
        lambda: wiring.buffers.close(timeout=left),
        abandon_on_cancel=False,
        limiter=trio.CapacityLimiter(1),
        description="closing the buffer pool",
        tracker=ThreadTracker(),  # what it waits for is reported, not the wait
    )


async def dispose(eval_fn: Any, deadline: float, wiring: Wiring) -> None:
    if getattr(type(eval_fn), "dispose", None) in (None, CheckpointEvalFn.dispose):
        return
    dispose = eval_fn.dispose
    with trio.move_on_at(deadline):
        try:
            if inspect.iscoroutinefunction(dispose):
                await dispose()
            else:
                await run_blocking(
                    dispose,
                    abandon_on_cancel=True,
                    limiter=trio.CapacityLimiter(1),
                    description="eval fn dispose()",
                    tracker=wiring.tracker,
                    hold_clock=False,
                )
        except Exception:
            log.exception("eval fn dispose() failed")

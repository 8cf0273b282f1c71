"""Starting and running an :class:`~actorsys._core.supervisor.EvalSupervisor`: meeting the
other ranks, releasing the staging dir's claim, the nursery its actors run in, and the eval fn's
warm-up in the background.

The supervisor wires the actors and owns what they hold; this module only starts them and keeps
them running until the body of ``EvalSupervisor.open`` is left.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from actorsys._core.collective.protocol import Collective
from actorsys._core.staging_claim import StagingClaim
from actorsys._core.wiring import Wiring
from actorsys.config import EvalConfig
from actorsys.runtime import ThreadTracker, run_blocking
from actorsys.sinks import Sink

log = logging.getLogger("actorsys")

__all__ = ["join_collective", "release_claim", "run_actors", "warm_up"]


async def join_collective(
    config: EvalConfig, sink: Sink, tracker: ThreadTracker
) -> tuple[Collective | None, Sink]:
    """Meet the other ranks' supervisors, in a worker thread (bounded by
    ``collective_timeout``), when this process is one rank of several; None when it is alone.
    Returns the collective and the sink the supervisor writes to: on the evaluating rank of
    several, ``sink`` as the collective observes it."""
    collective = await run_blocking(
        lambda: Collective.join(config), abandon_on_cancel=True,
        limiter=trio.CapacityLimiter(1), description="meeting the other ranks",
        tracker=tracker,
    )
    if collective is not None and collective.evaluating:
        sink = collective.observe(sink)
    return collective, sink


async def release_claim(claim: StagingClaim, tracker: ThreadTracker) -> None:
    """Release the staging dir's claim, in a worker thread, shielded from cancellation."""
    with trio.CancelScope(shield=True):
        await run_blocking(
            claim.release,
            abandon_on_cancel=False,
            limiter=trio.CapacityLimiter(1),
            description="releasing the staging dir",
            tracker=tracker,
        )


@asynccontextmanager
async def run_actors(
    wiring: Wiring,
    background: Callable[[], Awaitable[None]],
    aclose: Callable[[], Awaitable[Any]],
) -> AsyncIterator[None]:
    """Run the wired actors and ``background`` (a contributing rank's contribution, or the eval
    fn's warm-up) in one nursery for the body of the block; leaving it awaits ``aclose``."""
    body_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(wiring.actors.run)
            nursery.start_soon(background)
            try:
                yield
            except BaseException as exc:
                body_error = exc
                raise
            finally:
                await aclose()
    except BaseExceptionGroup as group:
        # The actors never raise out of the nursery, so a lone error here is the caller's
        # own, from the body of the `async with`: give it back to them as they raised it.
        if body_error is not None and group.exceptions == (body_error,):
            raise body_error from None
        raise


async def warm_up(eval_fn: Any, scope: trio.CancelScope) -> None:
    """Let the eval fn get ready for its first point, in the background: an eval fn that
    scores in worker processes (``DatasetEval``, ``ServerEvalFn``) starts and warms them
    (:mod:`actorsys.evals.scoring.pool`), so the first point pays no worker start. Its
    optional ``async def _warm_up()`` runs in the supervisor's nursery, inside ``scope``; close
    cancels it and never waits for it; it fails only with a log line."""
    method = getattr(eval_fn, "_warm_up", None)
    if not inspect.iscoroutinefunction(method):
        return
    with scope:
        try:
            await method()
        except Exception:
            log.warning("the eval fn could not get ready ahead of the first point",
                        exc_info=True)

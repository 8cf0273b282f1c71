"""Blocking work of an evaluation, in worker threads its supervisor accounts for.

An eval fn (``runtime="trio"``) that must call blocking code (read a file, tokenize, score)
awaits :func:`run_in_eval_thread` instead of ``trio.to_thread.run_sync``: the thread is listed
by the supervisor running the evaluation, so ``aclose`` reports it in ``stuck_threads`` if it
outlives the close, and it shares the evaluation's thread limiter. The supervisor's runner
sets the scope around each evaluation (a context variable, so tasks the eval fn starts inherit
it); outside an evaluation the thread is tracked by nobody.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

import trio

from actorsys.runtime.blocking import ThreadTracker, run_blocking

T = TypeVar("T")


@dataclass(frozen=True)
class EvalThreads:
    """The tracker and limiter of one supervisor's evaluation threads."""

    tracker: ThreadTracker
    limiter: trio.CapacityLimiter


_CURRENT: ContextVar[EvalThreads | None] = ContextVar("actorsys_eval_threads", default=None)


@contextlib.contextmanager
def evaluating_with(threads: EvalThreads) -> Iterator[None]:
    """Within this block (and in the tasks started from it), :func:`run_in_eval_thread` runs
    on ``threads``."""
    token = _CURRENT.set(threads)
    try:
        yield
    finally:
        _CURRENT.reset(token)


async def run_in_eval_thread(
    fn: Callable[[], T],
    *,
    abandon_on_cancel: bool,
    description: str = "eval fn work",
    hold_clock: bool = True,
) -> T:
    """Run ``fn()`` in a worker thread of the evaluation that calls it; return its result.

    Blocks the calling task, never the trio thread. On cancellation (the eval timeout, a
    drop, close): with ``abandon_on_cancel`` it returns at once and the thread runs on, listed
    in the supervisor's ``stuck_threads`` until it ends (only for work safe to leave running);
    without it, it waits for the thread. ``hold_clock``: virtual time stands still while the
    thread runs under an autojumping ``MockClock`` (pass False for work that waits on
    something the test releases only as time passes).
    """
    threads = _CURRENT.get()
    if threads is None:
        threads = EvalThreads(ThreadTracker(), trio.CapacityLimiter(1))
    return await run_blocking(
        fn,
        abandon_on_cancel=abandon_on_cancel,
        limiter=threads.limiter,
        description=description,
        tracker=threads.tracker,
        hold_clock=hold_clock,
    )

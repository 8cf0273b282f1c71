"""The one way actorsys runs blocking work: in a worker thread, with an explicit choice.

``abandon_on_cancel=True`` is only for work that is safe to leave running after its caller
moved on: it writes only into a private tmp directory, and the caller publishes the result
(a rename) from trio. Threads abandoned that way are tracked, so close can report them.

While a thread of actorsys's own work runs (``hold_clock=True``, the default), virtual time
stands still under trio's autojumping ``MockClock`` (:mod:`actorsys.runtime.clock_hold`): a
test's timeouts fire at their virtual time, never because a delete took a real millisecond.
Work that waits on the test itself, or that must let virtual time pass while it runs (an
evaluation a user wrote as a plain ``def``), passes ``hold_clock=False``.

Every job is also registered with :mod:`actorsys.runtime.exit_guard` while it runs, so that
the interpreter's exit waits (within a bound) for a job still inside torch, abandoned or not.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import trio

from actorsys.runtime.clock_hold import ClockHold, current_hold
from actorsys.runtime.exit_guard import guarded

T = TypeVar("T")


class ThreadTracker:
    """The blocking jobs currently running in worker threads, by description. Thread-safe.

    A job is listed from the moment it holds its limiter's token (so its thread is starting)
    until it returns, including after its caller abandoned it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, str] = {}
        self._next_id = 0

    def running(self) -> list[str]:
        with self._lock:
            return sorted(self._running.values())

    def _add(self, description: str) -> int:
        with self._lock:
            job_id = self._next_id
            self._next_id += 1
            self._running[job_id] = description
            return job_id

    def _remove(self, job_id: int) -> None:
        with self._lock:
            self._running.pop(job_id, None)


class _ListedWhileHeld:
    """A limiter that lists its job in the tracker once the job holds a token, and holds the
    clock from then until trio takes the thread's result back (also after an abandon).

    trio calls both methods in its own thread: ``acquire`` just before it starts the worker
    thread, ``release`` in the callback that hands the thread's result back (the same one that
    wakes the caller), so the clock is never free between the thread's end and its caller's
    wake-up.
    """

    def __init__(
        self,
        limiter: trio.CapacityLimiter,
        tracker: ThreadTracker,
        description: str,
        clock: ClockHold | None,
    ):
        self._limiter = limiter
        self._tracker = tracker
        self._description = description
        self._clock = clock
        self.job_id: int | None = None

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        await self._limiter.acquire_on_behalf_of(borrower)
        self.job_id = self._tracker._add(self._description)
        if self._clock is not None:
            self._clock.hold()

    def release_on_behalf_of(self, borrower: object) -> None:
        if self._clock is not None:
            self._clock.release()
        self._limiter.release_on_behalf_of(borrower)


async def run_blocking(
    fn: Callable[[], T],
    *,
    abandon_on_cancel: bool,
    limiter: trio.CapacityLimiter,
    description: str,
    tracker: ThreadTracker,
    hold_clock: bool = True,
) -> T:
    """Run ``fn()`` in a worker thread and return its result.

    Blocks on a token of ``limiter`` (one per actor, so one actor's stuck threads cannot starve
    another's), then on the thread. On cancellation: with ``abandon_on_cancel`` the call returns
    at once and the thread runs on, listed by ``tracker`` until it ends; without it, the call
    waits for the thread to finish. With ``hold_clock`` an autojumping ``MockClock`` does
    not jump while the thread runs (see the module's docstring). The interpreter's exit
    waits for the job (:mod:`actorsys.runtime.exit_guard`).
    """
    listed = _ListedWhileHeld(limiter, tracker, description, current_hold() if hold_clock else None)

    def job() -> T:
        try:
            with guarded(description):
                return fn()
        finally:
            if listed.job_id is not None:
                tracker._remove(listed.job_id)

    return await trio.to_thread.run_sync(
        job,
        abandon_on_cancel=abandon_on_cancel,
        limiter=listed,  # type: ignore[arg-type]
    )

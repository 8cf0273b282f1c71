"""The one way actorsys runs blocking work: in a worker thread, with an explicit choice.

``abandon_on_cancel=True`` is only for work that is safe to leave running after its caller
moved on: it writes only into a private tmp directory, and the caller publishes the result
(a rename) from trio. Threads abandoned that way are tracked, so close can report them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")


class ThreadTracker:
    """The blocking jobs currently running in worker threads, by description. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, str] = {}
        self._next_id = 0

    def running(self) -> list[str]:
        with self._lock:
            return sorted(self._running.values())

    def _wrap(self, description: str, fn: Callable[[], T]) -> Callable[[], T]:
        with self._lock:
            job_id = self._next_id
            self._next_id += 1
            self._running[job_id] = description

        def job() -> T:
            try:
                return fn()
            finally:
                with self._lock:
                    del self._running[job_id]

        return job


async def run_blocking(
    fn: Callable[[], T],
    *,
    abandon_on_cancel: bool,
    limiter: trio.CapacityLimiter,
    description: str,
    tracker: ThreadTracker,
) -> T:
    """Run ``fn()`` in a worker thread and return its result.

    Blocks on a token of ``limiter`` (one per actor, so one actor's stuck threads cannot starve
    another's), then on the thread. On cancellation: with ``abandon_on_cancel`` the call returns
    at once and the thread runs on, listed by ``tracker`` until it ends; without it, the call
    waits for the thread to finish.
    """
    job = tracker._wrap(description, fn)
    return await trio.to_thread.run_sync(job, abandon_on_cancel=abandon_on_cancel, limiter=limiter)

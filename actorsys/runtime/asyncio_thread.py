"""A private asyncio event loop in a dedicated daemon thread, for asyncio-written eval fns.

The host's asyncio is never touched: no event-loop policy is installed or replaced, and the
loop is set as current only inside its own thread.

Stopping is bounded and leaves nothing to the garbage collector: the loop's tasks are
cancelled and given ``grace`` seconds to run their clean-up (an OpenAI client closing its
connections); a task that ignores its cancellation longer is closed where it waits, while the
loop is still open, and only then is the loop closed. (A task left pending on a closed loop
runs its clean-up whenever it is collected, and fails there: "Event loop is closed".)
The interpreter's exit stops a loop still running the same way and waits for its thread
(:mod:`actorsys.runtime.exit_guard`): its tasks may be running torch in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from actorsys.runtime.exit_guard import guarded
from actorsys.runtime.futures import wait_future

T = TypeVar("T")
log = logging.getLogger("actorsys")

STOP_GRACE = 5.0
"""Seconds the tasks of a stopping loop have to finish once cancelled."""
CLOSE_TRIES = 100
"""How many times a task that ignored its cancellation is closed where it waits (each clean-up
step that awaits stops it again), at most."""
DESCRIPTION = "asyncio eval loop"
"""How the loop's thread is named where it is still running (``stuck_threads``, at exit)."""


class AsyncioThread:
    """Owns one asyncio loop running forever in a daemon thread, until ``stop``."""

    def __init__(self, name: str = "actorsys-asyncio") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._stop_lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                with guarded(DESCRIPTION, stop=self._stop_soon):
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    try:
                        loop.run_forever()
                    finally:
                        loop.close()

            self._thread = threading.Thread(target=serve, name=self._name, daemon=True)
            self._thread.start()
            ready.wait()
            self._loop = loop
        return self._loop

    def _stop_soon(self) -> None:
        self.stop(timeout=0)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the private loop and return its result.

        Blocks the calling trio task (not the trio thread) until the coroutine finishes. If the
        trio task is cancelled, the asyncio task is cancelled through
        ``loop.call_soon_threadsafe`` and this returns at once, without waiting for it.
        """
        loop = self._ensure_started()
        return await wait_future(asyncio.run_coroutine_threadsafe(coro, loop))

    def stop(self, timeout: float = 1.0, *, grace: float = STOP_GRACE) -> bool:
        """Stop the loop and join its thread for up to ``timeout`` s; True if it ended.

        The loop's tasks are cancelled and have ``grace`` seconds to finish; one still running
        then is closed where it waits. The shutdown runs in the loop's own thread, so a
        ``timeout`` of 0 returns at once and the thread ends within about ``grace`` (unless a
        task blocks the thread itself). Thread-safe: the exit may stop it while close does."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return True
        with self._stop_lock:
            first, self._stopping = not self._stopping, True
        if first:
            with contextlib.suppress(RuntimeError):  # the loop is closed already
                asyncio.run_coroutine_threadsafe(_shut_down(grace), loop)
        thread.join(timeout)
        return not thread.is_alive()


async def _shut_down(grace: float) -> None:
    """On the loop: cancel every other task not cancelled yet (and those their clean-up
    starts), wait for them up to ``grace`` s, close those that ignored their cancellation,
    then stop the loop."""
    loop = asyncio.get_running_loop()
    current = asyncio.current_task()
    deadline = loop.time() + grace
    cancelled: set[asyncio.Task[Any]] = set()
    while tasks := asyncio.all_tasks() - {current}:
        for task in tasks - cancelled:
            if not task.cancelling():  # one cancelled already is cleaning up: not twice
                task.cancel()
        cancelled |= tasks
        left = deadline - loop.time()
        if left <= 0:
            break
        await asyncio.wait(tasks, timeout=left)
    stragglers = asyncio.all_tasks() - {current}
    for task in stragglers:
        log.warning("an asyncio task ignored its cancellation for %.1f s; closing it: %r",
                    grace, task)
        _close(task.get_coro())
        task.cancel()  # its next step finds its coroutine closed, and ends it
    if stragglers:
        await asyncio.wait(stragglers, timeout=1.0)
    for task in stragglers:
        if task.done() and not task.cancelled():
            task.exception()  # "cannot reuse already awaited coroutine": told above
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(loop.shutdown_asyncgens(), max(deadline - loop.time(), 1.0))
    loop.stop()


def _close(coro: object) -> None:
    """Close a task's coroutine where it waits; again where its clean-up awaits, if it does."""
    close = getattr(coro, "close", None)
    if close is None:
        return
    for _ in range(CLOSE_TRIES):
        try:
            close()
        except RuntimeError:  # "coroutine ignored GeneratorExit": it awaited while closing
            continue
        except Exception:
            log.debug("closing an asyncio task's coroutine raised", exc_info=True)
        return

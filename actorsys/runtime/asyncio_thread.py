"""A private asyncio event loop in a dedicated daemon thread, for asyncio-written eval fns.

The host's asyncio is never touched: no event-loop policy is installed or replaced, and the
loop is set as current only inside its own thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from actorsys.runtime.futures import wait_future

T = TypeVar("T")


class AsyncioThread:
    """Owns one asyncio loop running forever in a daemon thread, until ``stop``."""

    def __init__(self, name: str = "actorsys-asyncio") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
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

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the private loop and return its result.

        Blocks the calling trio task (not the trio thread) until the coroutine finishes. If the
        trio task is cancelled, the asyncio task is cancelled through
        ``loop.call_soon_threadsafe`` and this returns at once, without waiting for it.
        """
        loop = self._ensure_started()
        return await wait_future(asyncio.run_coroutine_threadsafe(coro, loop))

    def stop(self, timeout: float = 1.0) -> bool:
        """Stop the loop and join its thread for up to ``timeout`` s; True if it ended."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return True
        if not loop.is_closed():
            loop.call_soon_threadsafe(_cancel_all_and_stop, loop)
        thread.join(timeout)
        return not thread.is_alive()


def _cancel_all_and_stop(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()
    # Stop one iteration later, so the cancelled tasks run their clean-up first.
    loop.call_soon(loop.stop)

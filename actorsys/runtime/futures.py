"""Awaiting a ``concurrent.futures.Future`` from trio, without a thread per wait.

Futures completed by another thread (an asyncio loop's ``run_coroutine_threadsafe``, Ray's
``ObjectRef.future()``) wake the waiting trio task through its run's token. Cancelling the
waiter calls ``cancel`` (which tells the other side to stop) and returns at once: the other
side may still be winding down, and is not waited for.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")


async def wait_future(
    future: concurrent.futures.Future[T], *, cancel: Callable[[], object] | None = None
) -> T:
    """The result of ``future`` (raising its exception), once it is done.

    Blocks the calling trio task, not the trio thread. If the task is cancelled first,
    ``cancel()`` is called (default: ``future.cancel``) and ``trio.Cancelled`` propagates.
    """
    done = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def wake(_: object) -> None:
        try:
            token.run_sync_soon(done.set)
        except trio.RunFinishedError:
            pass

    future.add_done_callback(wake)
    try:
        await done.wait()
    except BaseException:
        if not future.done():
            (cancel or future.cancel)()
        raise
    return future.result()

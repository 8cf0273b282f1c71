"""An asyncio host's ``export=`` callable, run on the host's own loop.

The supervisor awaits a delegated export in its trio thread, where an asyncio-written export
(awaiting Ray refs, ``asyncio.gather`` across training workers) cannot run. So
:class:`~bridge.AsyncEvalBridge` hands the supervisor a trio-side stand-in: it schedules the
host's coroutine on the host loop with ``asyncio.run_coroutine_threadsafe`` and waits for its
future; when the supervisor cancels the export (``export_timeout``, close), the future is
cancelled, which cancels the host's task the next time its loop runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from actorsys.runtime import wait_future

HostExport = Callable[[int, str], Awaitable[Any]]


def on_host_loop(export: HostExport, loop: asyncio.AbstractEventLoop) -> HostExport:
    """A trio-side ``async (step, path)`` that runs ``export(step, path)`` on ``loop``.

    ``export`` may return any awaitable (a coroutine, a Ray ``ObjectRef``, a gather). The
    stand-in blocks its trio task until the host's task ends; a host loop that is blocked (a
    sync ``ray.get``) delays the export, and the supervisor's ``export_timeout`` bounds that.
    Cancelling it returns at once, without waiting for the host's task to wind down.
    """

    async def export_on_host(step: int, path: str) -> None:
        async def host_side() -> None:
            await export(step, path)

        coro = host_side()
        try:
            future = asyncio.run_coroutine_threadsafe(coro, loop)
        except BaseException:
            coro.close()
            raise
        await wait_future(future)

    export_on_host.__qualname__ = f"on_host_loop({getattr(export, '__qualname__', export)!r})"
    return export_on_host

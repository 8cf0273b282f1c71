"""Calls of a Ray driver into Ray, made from an event loop: awaiting an ``ObjectRef`` from
trio (cancelling the wait cancels the task), waiting for several under trio or asyncio, and the
blocking calls (the import, creating and killing actors) run in worker threads.

Ray is imported only inside these functions: importing this module needs no Ray.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import sniffio
import trio

from actorsys.runtime import ThreadTracker, run_blocking, wait_future

log = logging.getLogger("actorsys.fleet")

T = TypeVar("T")


async def await_ref(ref: Any, *, force: bool = False) -> Any:
    """The value of the Ray ``ObjectRef`` ``ref``, awaited from trio.

    Blocks the calling task (not the trio thread) on ``ref.future()``. Cancelling the task
    calls ``ray.cancel(ref, force=force)`` and returns at once. A queued task never runs; a
    running one is interrupted where Ray can: an async actor's task is cancelled, a plain
    task's worker is killed only with ``force=True``, a sync actor's method runs on.
    """
    import ray

    def cancel() -> None:
        try:
            ray.cancel(ref, force=force)
        except Exception as exc:
            log.warning("ray.cancel(%s) failed: %r", ref, exc)

    return await wait_future(ref.future(), cancel=cancel)


async def all_answer(refs: list[Any]) -> None:
    """Wait for every ref, under trio or under asyncio (an asyncio driver may open a fleet
    too; its engines are then used from the bridge's trio thread)."""
    if sniffio.current_async_library() == "asyncio":
        await asyncio.gather(*(asyncio.wrap_future(ref.future()) for ref in refs))
        return
    async with trio.open_nursery() as nursery:
        for ref in refs:
            nursery.start_soon(await_ref, ref)


def import_ray() -> Any:
    """The ``ray`` module (blocking: its first import takes seconds)."""
    import ray

    return ray


def kill_actors(ray: Any, actors: Sequence[Any]) -> None:
    """Kill ``actors`` for good (no restart), if Ray is still initialized. Blocking."""
    if ray.is_initialized():
        for actor in actors:
            ray.kill(actor, no_restart=True)


class RayCalls:
    """The blocking calls of a fleet's driver into Ray (its import, creating and killing
    actors), each in a worker thread, under trio (tracked in ``threads``) or asyncio: the
    event loop's thread never waits on Ray's control store."""

    def __init__(self) -> None:
        self.threads = ThreadTracker()
        under_trio = sniffio.current_async_library() == "trio"
        self._limiter = trio.CapacityLimiter(1) if under_trio else None

    async def __call__(self, fn: Callable[[], T], description: str, *, abandon: bool = True) -> T:
        """``fn()`` in a worker thread; with ``abandon``, left to run on when the caller is
        cancelled, else waited for."""
        if self._limiter is None:
            return await asyncio.to_thread(fn)
        return await run_blocking(fn, abandon_on_cancel=abandon, limiter=self._limiter,
                                  description=description, tracker=self.threads)

    async def shielded(self, fn: Callable[[], None], description: str, bound: float) -> None:
        """``fn()`` also while the caller is cancelled, waited for ``bound`` seconds at
        most (then it runs on in its thread)."""
        if self._limiter is None:
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.to_thread(fn)), bound)
            except TimeoutError:
                log.warning("%s: not done within %s s; it goes on in its thread",
                            description, bound)
            return
        with trio.CancelScope(shield=True), trio.move_on_after(bound) as waited:
            await self(fn, description)
        if waited.cancelled_caught:
            log.warning("%s: not done within %s s; it goes on in its thread", description, bound)

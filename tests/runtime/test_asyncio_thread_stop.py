"""Stopping the private asyncio loop lets the tasks it cancels run their clean-up first (an
eval fn's ``finally`` / ``async with`` exits run even when close cuts it off)."""

from __future__ import annotations

import asyncio
import threading

import trio

from actorsys.runtime import AsyncioThread


async def test_stop_lets_a_cancelled_eval_run_its_finally() -> None:
    thread = AsyncioThread()
    started, cleaned_up = threading.Event(), threading.Event()

    async def evaluate_forever() -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            cleaned_up.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(thread.run, evaluate_forever())
        assert await trio.to_thread.run_sync(started.wait, 10)
        assert thread.stop(timeout=10)
        nursery.cancel_scope.cancel()

    assert cleaned_up.is_set()

"""Holding an autojumping MockClock while work outside trio runs.

Under trio's MockClock with autojump (pytest-trio's ``autojump_clock``), time jumps to the
next deadline as soon as every task is blocked, and a task waiting on a worker thread or on a
worker process's pipe is blocked as far as trio can tell (trio issue 456). Deadlines would
then expire at once while the work they bound is still running. A task waiting in
``trio.testing.wait_all_tasks_blocked`` counts as activity to autojump, so holding one open for
the duration holds the clock; it composes with any other hold.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing


@asynccontextmanager
async def holding_mock_clock() -> AsyncIterator[None]:
    """While the body runs, an autojumping MockClock does not jump; under any other clock,
    nothing. Blocks on nothing itself."""
    if not isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock):
        yield
        return
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.testing.wait_all_tasks_blocked, math.inf)
        try:
            yield
        finally:
            nursery.cancel_scope.cancel()

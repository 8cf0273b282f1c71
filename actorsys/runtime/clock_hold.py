"""Virtual time stands still while actorsys's own worker threads run.

Under trio's ``MockClock`` with autojump (pytest-trio's ``autojump_clock``), the clock jumps
to the next deadline as soon as every trio task is blocked, and a task waiting for a worker
thread counts as blocked (trio issue 456): a delete that takes a real millisecond would let a
``drain(timeout=1000)`` return at virtual time 1000. trio documents one thing that keeps
autojump from jumping: a task waiting in :func:`trio.testing.wait_all_tasks_blocked`. So
while at least one held thread runs, one system task of this run waits there with an
infinite cushion (it never wakes by itself), and it is cancelled when the last held thread
ends. With a real clock, or a MockClock without autojump, the waiting task changes nothing.
Manual ``MockClock.jump`` calls still move time.

Only trio's own thread calls ``hold`` and ``release`` (the worker-thread limiter does, as the
thread gets its token and as trio takes its result back; :func:`holding_clock` around other
work outside trio, such as a wait on a worker process's pipe), so no lock is needed.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing


class ClockHold:
    """The held threads of one trio run, and the task that keeps autojump from jumping."""

    def __init__(self) -> None:
        self.held = 0
        self._wanted = trio.Event()
        self._scope: trio.CancelScope | None = None
        trio.lowlevel.spawn_system_task(self._keep_clock, name="actorsys clock hold")

    def hold(self) -> None:
        self.held += 1
        self._wanted.set()

    def release(self) -> None:
        self.held -= 1
        if self.held == 0:
            self._wanted = trio.Event()
            if self._scope is not None:
                self._scope.cancel()

    async def _keep_clock(self) -> None:
        while True:
            await self._wanted.wait()
            with trio.CancelScope() as self._scope:
                if self.held:
                    await trio.testing.wait_all_tasks_blocked(cushion=math.inf)
            self._scope = None


_HOLD: trio.lowlevel.RunVar[ClockHold] = trio.lowlevel.RunVar("actorsys_clock_hold")


def current_hold() -> ClockHold:
    """This trio run's clock hold (made at first use)."""
    try:
        return _HOLD.get()
    except LookupError:
        hold = ClockHold()
        _HOLD.set(hold)
        return hold


@asynccontextmanager
async def holding_clock() -> AsyncIterator[None]:
    """While the body runs, an autojumping ``MockClock`` does not jump: for work outside trio
    that trio sees only as a wait (a worker process answering over a pipe). Blocks on nothing
    itself; under any other clock it changes nothing."""
    hold = current_hold()
    hold.hold()
    try:
        yield
    finally:
        hold.release()

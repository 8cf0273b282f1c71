"""A trainer's weight update of a shared fleet, entered from a host thread: the bridges'
``weight_update``.

The trio side enters :meth:`actorsys.EvalSupervisor.weight_update` in a task of its own and
holds the block open until the host leaves it. The host waits for the entry for the entry's
own budget (plus the margin that carries the answer back), never longer: a trio thread that
is gone or slow to answer lets the host go on, as entry never raises for a timeout.
"""

from __future__ import annotations

import threading

import trio

from actorsys.config import EvalConfig, require_seconds
from bridge._budgets import MARGIN_MAX
from bridge._calls import Call
from bridge._thread import Command, TrioThread


class HostUpdate:
    """One ``weight_update`` as a host sees it: ``entered`` is answered once the trio side
    is inside the block (or refused it); :meth:`leave` lets the block end."""

    def __init__(self, trio_thread: TrioThread, config: EvalConfig, timeout: float | None) -> None:
        if timeout is not None:
            require_seconds("weight_update(timeout)", timeout, allow_zero=True)
        self._trio = trio_thread
        self.entered: Call[None] = Call("weight_update")
        self._leave: trio.Event | None = None
        self._left = threading.Event()
        budget = config.shared_update_timeout if timeout is None else timeout
        self.wait_bound = (0.0 if config.shared_update == "preempt" else budget) + MARGIN_MAX
        trio_thread.post(Command(
            lambda nursery: nursery.start_soon(self._hold, timeout), refuse=self._refused,
        ))

    def _refused(self) -> None:
        self.entered.deliver(None)  # nothing to wait for: no supervisor runs

    async def _hold(self, timeout: float | None) -> None:  # noqa: ASYNC109 - a budget
        leave = self._leave = trio.Event()
        if self._left.is_set():
            leave.set()
        try:
            async with self._trio.supervisor.weight_update(timeout):
                self.entered.deliver(None)
                await leave.wait()
        except Exception as exc:
            if not self.entered.future.done():
                self.entered.fail(exc)

    def result(self) -> None:
        """After the host's wait: raise what the entry raised (a ``ConfigError`` on a rank
        that is not the evaluating one); nothing if it entered, or if it did not answer in
        time (then the block is entered late, or never, and left when the host leaves)."""
        future = self.entered.abandon()
        if future is not None:
            future.result()

    def leave(self) -> None:
        """End the block (from the host thread); never blocks."""
        self._left.set()

        def wake(nursery: trio.Nursery) -> None:
            if self._leave is not None:
                self._leave.set()

        self._trio.post(Command(wake))

"""The weight gate: a trainer's update of a shared fleet's weights waits, within a budget,
for the ``served`` points admitted before it, and no evaluation starts on a shared fleet
while the update runs.

``async with gate.update(budget):`` (``EvalSupervisor.weight_update``) on entry notes which
served points are in flight (queued, pinning or evaluating) and waits until every one has
settled, for at most ``budget`` seconds (0 under ``shared_update="preempt"``). What has not
settled by then is cut: ``preempted`` if it was evaluating (its scores measured weights that
are about to change), ``superseded`` if not. Entry never raises for the budget. From then
until the block is left, the shared pinner lends no fleet (:meth:`wait_startable`), so a
point admitted during the update waits and is pinned to whatever version the engines serve
after it. Served points admitted before an entry still start while that entry waits for
them, so a trainer that submits and updates at once loses nothing.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from actorsys.actors.flight import Flight
from actorsys.actors.point import Source, State

log = logging.getLogger("actorsys")

__all__ = ["WeightGate"]


class WeightGate:
    """One supervisor's gate over its shared fleets; lives on the trio thread."""

    def __init__(self, flight: Flight) -> None:
        self._flight = flight
        self._order = itertools.count()
        self._admitted: dict[int, int] = {}
        """Each served point's admission number (steps leave when they settle)."""
        self._entries: list[int] = []
        """The admission number each entry still waiting was made at (its cut-off)."""
        self._updating = 0
        self._changed = trio.lowlevel.ParkingLot()
        self.waits = 0
        self.wait_seconds = 0.0

    def admitted(self, step: int) -> None:
        """A served point of ``step`` was admitted (its place in the order of entries)."""
        self._admitted[step] = next(self._order)

    def startable(self, step: int) -> bool:
        """Whether the served point of ``step`` may be lent a shared fleet now: no update is
        running, and every entry waiting was made after its admission."""
        if self._updating:
            return False
        number = self._admitted.get(step, -1)
        return all(number < cutoff for cutoff in self._entries)

    async def wait_startable(self, step: int) -> None:
        """Block until :meth:`startable`; always a checkpoint; cancellable."""
        await trio.lowlevel.checkpoint()
        while not self.startable(step):
            await self._changed.park()

    @asynccontextmanager
    async def update(self, budget: float) -> AsyncIterator[None]:
        """Enter an update of the shared fleets' weights; see the module docstring. Returns
        within ``budget`` seconds (trio time) of the call, cut points included; shielded
        from outer cancellation for that long only (the caller's cancel scope still ends
        the block)."""
        cutoff = next(self._order)
        for step in [s for s in self._admitted if not self._in_flight(s)]:
            del self._admitted[step]  # settled: only the points in flight are remembered
        waiting = self._served_in_flight(cutoff)
        started = trio.current_time()
        self._entries.append(cutoff)
        try:
            with trio.move_on_after(budget):
                while any(self._in_flight(step) for step in waiting):
                    await self._flight.wait_changed()
            left = [step for step in waiting if self._in_flight(step)]
            self._cut(left, budget)
        finally:
            self._entries.remove(cutoff)
            self._updating += 1
        if waiting:
            self.waits += 1
            self.wait_seconds += trio.current_time() - started
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            yield
        finally:
            self._updating -= 1
            self._changed.unpark_all()

    def _served_in_flight(self, cutoff: int) -> list[int]:
        return [
            ticket.step for ticket in self._flight
            if ticket.point.source is Source.SERVED
            and self._admitted.get(ticket.step, math.inf) < cutoff
            and ticket.state not in (State.SETTLE, State.SETTLED)
        ]

    def _in_flight(self, step: int) -> bool:
        ticket = self._flight.get(step)
        return ticket is not None and ticket.state not in (State.SETTLE, State.SETTLED)

    def _cut(self, steps: list[int], budget: float) -> None:
        for step in steps:
            ticket = self._flight.get(step)
            if ticket is None:
                continue
            evaluating = ticket.state is State.EVAL
            reason = "preempted" if evaluating else "superseded"
            error = (
                f"the trainer updated the shared fleet's weights after {budget:g} s of waiting "
                + ("during this evaluation (its scores are discarded)" if evaluating
                   else "before this point was evaluated")
            )
            if ticket.drop(reason, error):
                log.info("step %d cut by a weight update (%s)", step, reason)

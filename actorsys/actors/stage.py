"""The loop every working stage shares: guard, hold, time, forward.

A stage actor takes a point from its inbox and owns it until it forwards it: to the next
stage when its work is :class:`Done`, to the Retirer when it is a :class:`Skip`, when the point
was dropped (its work is cancelled), or when the work crashed (the actor then crashes too, and
its supervisor restarts it). A point reaches its next owner only through the one that has it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from actorsys.actors.flight import Flight
from actorsys.actors.point import Point, State, Ticket

if TYPE_CHECKING:
    from actorsys.actors.retirer import Retirer


@dataclass(frozen=True)
class Done:
    """The stage did its work; ``point`` carries what it added."""

    point: Point


@dataclass(frozen=True)
class Skip:
    """The stage could not do its work: the point settles skipped with ``reason``.
    ``point``, if given, is the point as the stage left it (the one it got, if not)."""

    reason: str
    error: str | None = None
    point: Point | None = None


Result = Done | Skip


def within(seconds: float | None) -> trio.CancelScope:
    """A scope that gives up after ``seconds`` (None: never)."""
    return trio.move_on_after(math.inf if seconds is None else seconds)


class Stage:
    """One working stage. Subclasses give ``work`` and, for what they lend a point, ``lease``
    (before the timed work) and ``leave`` (when the point leaves them)."""

    name: str
    state: State
    next_state: State
    metric: str

    def __init__(self, flight: Flight, retirer: Retirer) -> None:
        self.flight = flight
        self.retirer = retirer
        self._held: dict[int, trio.CancelScope] = {}
        self._stranded: dict[int, Point] = {}
        self._send_on: Callable[[Point], None] | None = None

    async def lease(self, point: Point, ticket: Ticket) -> Point:
        return point

    async def work(self, point: Point) -> Result:
        raise NotImplementedError

    def leave(self, point: Point, *, done: bool) -> Point:
        return point

    def pass_on(self, ticket: Ticket, point: Point) -> None:
        assert self._send_on is not None
        ticket.state, ticket.owner, ticket.point = self.next_state, None, point
        self._send_on(point)

    # -- ownership ------------------------------------------------------------------------

    def dropped(self, ticket: Ticket) -> None:
        scope = self._held.get(ticket.step)
        if scope is not None:
            scope.cancel()

    def take(self, point: Point) -> Ticket | None:
        """Guard a point arriving from the inbox: its ticket if this stage should work on it;
        None if it was dropped (or settled) on its way here, and so went on to the Retirer."""
        ticket = self.flight.get(point.step)
        if ticket is None or ticket.state is State.SETTLED:
            self.retirer.discard(self.leave(point, done=False))
            return None
        if ticket.drop_reason is not None:
            self.retirer.take(ticket, self.leave(point, done=False).skipped(*ticket.drop_reason))
            return None
        ticket.state, ticket.owner = self.state, self
        return ticket

    async def process(self, point: Point) -> None:
        """Hold ``point`` for this stage's work, then forward it; re-raises a crash of the
        work after the point went on to settle ``crashed``."""
        ticket = self.take(point)
        if ticket is None:
            return
        result: Result | None = None
        crash: Exception | None = None
        started: float | None = None
        with trio.CancelScope() as scope:
            self._held[point.step] = scope
            try:
                point = await self.lease(point, ticket)
                started = trio.current_time()
                result = await self.work(point)
            except Exception as exc:
                crash = exc
                result = Skip("crashed", f"actor {self.name} crashed: {exc!r}")
            finally:
                del self._held[point.step]
                out = point if result is None or result.point is None else result.point
                if started is not None:
                    out = out.timed(self.metric, trio.current_time() - started)
                self._forward(ticket, out, result)
        if crash is not None:
            raise crash

    def crashed(self, exc: Exception) -> None:
        """This actor crashed: the points its crash cut off settle ``crashed``."""
        stranded, self._stranded = self._stranded, {}
        for step, point in stranded.items():
            ticket = self.flight.get(step)
            if ticket is not None:
                error = f"actor {self.name} crashed: {exc!r}"
                self._forward(ticket, point, Skip("crashed", error))

    def _forward(self, ticket: Ticket, point: Point, result: Result | None) -> None:
        if ticket.state is State.SETTLED or self.flight.get(ticket.step) is not ticket:
            self.retirer.discard(self.leave(point, done=False))
        elif isinstance(result, Done) and ticket.drop_reason is None:
            self.pass_on(ticket, self.leave(point, done=True))
        elif ticket.drop_reason is not None:
            self.retirer.take(ticket, self.leave(point, done=False).skipped(*ticket.drop_reason))
        elif isinstance(result, Skip):
            point = self.leave(point, done=False).skipped(result.reason, result.error)
            self.retirer.take(ticket, point)
        else:
            # Cancelled from outside (a sibling's crash, the supervisor stopping): the point
            # stays this actor's until its crash is reported or a close settles it.
            ticket.point = self._stranded[ticket.step] = self.leave(point, done=False)


class SequentialStage(Stage):
    """A stage that works on one point at a time, in the order they came.

    Points waiting for their turn are its own (not left in a channel), so a drop reaches a
    waiting point at once: it goes on to the Retirer without waiting for the turn.
    """

    def __init__(self, flight: Flight, retirer: Retirer) -> None:
        super().__init__(flight, retirer)
        self._waiting: deque[Point] = deque()
        self._arrived = trio.lowlevel.ParkingLot()
        self._ended = False

    def dropped(self, ticket: Ticket) -> None:
        for point in self._waiting:
            if point.step == ticket.step:
                self._waiting.remove(point)
                self.take(point)
                return
        super().dropped(ticket)

    async def run(
        self, inbox: trio.MemoryReceiveChannel[Point], onward: trio.MemorySendChannel[Point]
    ) -> None:
        crash: Exception | None = None
        async with inbox, onward, trio.open_nursery() as nursery:
            self._send_on = onward.send_nowait
            nursery.start_soon(self._receive, inbox)
            try:
                while (point := await self._next()) is not None:
                    await self.process(point)
            except Exception as exc:
                crash = exc
            nursery.cancel_scope.cancel()
        if crash is not None:
            raise crash

    async def _receive(self, inbox: trio.MemoryReceiveChannel[Point]) -> None:
        async for point in inbox:
            if self.take(point) is not None:
                self._waiting.append(point)
                self._arrived.unpark_all()
        self._ended = True
        self._arrived.unpark_all()

    async def _next(self) -> Point | None:
        while not self._waiting:
            if self._ended:
                return None
            await self._arrived.park()
        return self._waiting.popleft()

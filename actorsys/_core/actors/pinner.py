"""FleetPinner: owns the idle fleets; lends one to each point and pins it to the point's version.

A fleet is idle only while no point holds its :class:`~actorsys._core.point.FleetLease`: the
pinner lends it when it takes the next point, and gets it back by message (``give_back``)
from whoever holds the point when it is done with it: the EvalRunner after the evaluation,
or the pinner itself when the pin fails or the point is dropped. So a fleet is never pinned
while an evaluation runs on it.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from actorsys._core.actors.retirer import Retirer
from actorsys._core.actors.stage import Done, Result, SequentialStage, Skip
from actorsys._core.flight import Flight
from actorsys._core.point import FleetLease, Point, State, Ticket
from actorsys.config import EvalConfig
from actorsys.fleet import Fleet, PinError
from actorsys.outcome import PIN_TIME_SECONDS

NAME = "pinner"


class FleetPinner(SequentialStage):
    name = NAME
    state = State.PIN
    next_state = State.EVAL
    metric = PIN_TIME_SECONDS

    def __init__(
        self,
        config: EvalConfig,
        flight: Flight,
        retirer: Retirer,
        fleets: Sequence[Fleet | None],
    ) -> None:
        super().__init__(flight, retirer)
        self.config = config
        self._returned, self._idle = trio.open_memory_channel[Fleet | None](len(fleets))
        for fleet in fleets:
            self._returned.send_nowait(fleet)

    def give_back(self, lease: FleetLease) -> None:
        """A fleet's evaluation (or failed pin) is over: it is idle again."""
        self._returned.send_nowait(lease.fleet)

    async def lease(self, point: Point, ticket: Ticket) -> Point:
        fleet = await self._idle.receive()
        ticket.state = State.PINNING
        return point.but(lease=FleetLease(fleet))

    def leave(self, point: Point, *, done: bool) -> Point:
        return point if done else self.reclaim(point)

    def reclaim(self, point: Point) -> Point:
        """``point`` without its fleet, which is idle again."""
        if point.lease is None:
            return point
        self.give_back(point.lease)
        return point.but(lease=None)

    async def work(self, point: Point) -> Result:
        assert point.lease is not None
        fleet, version, config = point.lease.fleet, str(point.step), self.config
        if fleet is None:
            return Done(point.but(weight_version=version))
        assert point.snapshot is not None
        with trio.move_on_after(config.pin_timeout) as deadline:
            try:
                await fleet.pin(
                    point.snapshot, version, retries=config.pin_retries, probe=config.probe
                )
            except PinError as exc:
                return Skip(exc.reason, str(exc), point)
        if deadline.cancelled_caught:
            message = f"pin of {fleet!r} took longer than {config.pin_timeout} s"
            return Skip("pin_timeout", message, point)
        return Done(point.but(weight_version=version))

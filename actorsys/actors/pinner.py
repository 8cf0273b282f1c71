"""FleetPinner: owns the idle fleets; lends one to each point and pins it to the point's version.

A fleet is idle only while no point holds its :class:`~actorsys.actors.point.FleetLease`: the
pinner lends it when it takes the next point, and gets it back over the fleet pool's channel
(the supervisor owns it; whoever holds the point when it is done with it sends the fleet back,
:func:`give_back`): the EvalRunner after the evaluation, or the pinner itself when the pin
fails or the point is dropped. So a fleet is never pinned while an evaluation runs on it.

A pin is done, and the point goes on to be evaluated, once every engine reads the version
back and has answered the weight probe. The probe's verdict (the answers judged against the
snapshot's own, computed by the supervisor's one reference worker, a process the pinner
starts when it starts, if a fleet has engines to probe, and kills when its loop ends) is the
pinner's to deliver: it runs in the pinner's nursery of verdicts, within the point's pin
deadline, and reaches the point's holder through the lease (``FleetLease.verdict``). So
nothing the reference costs delays the evaluation, and the point still settles only after the verdict.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence

import trio

from actorsys.actors.flight import Flight
from actorsys.actors.point import FleetLease, Point, State, Ticket
from actorsys.actors.retirer import Retirer
from actorsys.actors.stage import Done, Result, SequentialStage, Skip
from actorsys.config import EvalConfig
from actorsys.fleet import Fleet, PinError
from actorsys.fleet.pin.reference import ReferenceWorker
from actorsys.fleet.pin.verdict import PinVerdict
from actorsys.outcome import PIN_TIME_SECONDS

NAME = "pinner"
log = logging.getLogger("actorsys")


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
        idle: trio.MemoryReceiveChannel[Fleet | None],
        returns: trio.MemorySendChannel[Fleet | None],
        *,
        warm_references: bool = False,
    ) -> None:
        super().__init__(flight, retirer)
        self.config = config
        self._idle = idle
        self._returns = returns
        self._verdicts: trio.Nursery | None = None
        self._references = ReferenceWorker()
        self._warm_references = warm_references

    async def run(
        self, inbox: trio.MemoryReceiveChannel[Point], onward: trio.MemorySendChannel[Point]
    ) -> None:
        """The stage's loop, beside the nursery where the verdicts of its pins settle: a
        normal end waits for them (each within its pin deadline), a crash cancels them.
        Whatever the end, the reference worker is killed."""
        crash: Exception | None = None
        try:
            async with trio.open_nursery() as verdicts:
                self._verdicts = verdicts
                if self._warm_references:
                    verdicts.start_soon(self._warm)
                try:
                    await super().run(inbox, onward)
                except Exception as exc:
                    crash = exc
                    verdicts.cancel_scope.cancel()
        finally:
            await self._references.aclose()
        if crash is not None:
            raise crash

    async def _warm(self) -> None:
        """Start the reference worker ahead of the first pin (its imports then overlap the
        first point's export, not its verdict); a start that fails is tried again by the
        first reference asked, which reports a second failure on its point."""
        try:
            await self._references.warm()
        except OSError as exc:
            log.warning("the reference worker could not start ahead of the first pin: %r", exc)

    async def lease(self, point: Point, ticket: Ticket) -> Point:
        fleet = await self._idle.receive()
        ticket.state = State.PINNING
        return point.but(lease=FleetLease(fleet))

    def leave(self, point: Point, *, done: bool) -> Point:
        return point if done else self.reclaim(point)

    def reclaim(self, point: Point) -> Point:
        """``point`` without its fleet, which is idle again."""
        return give_back(point, self._returns)

    async def work(self, point: Point) -> Result:
        assert point.lease is not None
        fleet, version, config = point.lease.fleet, str(point.step), self.config
        if fleet is None:
            return Done(point.but(weight_version=version))
        assert point.snapshot is not None and self._verdicts is not None
        deadline = trio.current_time() + config.pin_timeout
        with trio.move_on_at(deadline) as scope:
            try:
                verdict: PinVerdict = await self._verdicts.start(
                    functools.partial(
                        fleet.pin_and_verify,
                        point.snapshot,
                        version,
                        retries=config.pin_retries,
                        probe=config.probe,
                        references=self._references,
                        deadline=deadline,
                    )
                )
            except PinError as exc:
                return Skip(exc.reason, str(exc), point)
        if scope.cancelled_caught:
            message = f"pin of {fleet!r} took longer than {config.pin_timeout} s"
            return Skip("pin_timeout", message, point)
        lease = dataclasses.replace(point.lease, verdict=verdict)
        return Done(point.but(weight_version=version, lease=lease))


def fleet_pool(
    fleets: Sequence[Fleet | None],
) -> tuple[trio.MemorySendChannel[Fleet | None], trio.MemoryReceiveChannel[Fleet | None]]:
    """The channel of idle fleets, holding every fleet (room for all, so a return never
    waits)."""
    returns, idle = trio.open_memory_channel[Fleet | None](len(fleets))
    for fleet in fleets:
        returns.send_nowait(fleet)
    return returns, idle


def give_back(point: Point, returns: trio.MemorySendChannel[Fleet | None]) -> Point:
    """``point`` without its fleet, sent back over ``returns``: its evaluation (or failed
    pin) is over, the fleet is idle again."""
    if point.lease is None:
        return point
    returns.send_nowait(point.lease.fleet)
    return point.but(lease=None)

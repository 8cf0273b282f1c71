"""FleetPinner: owns the idle fleets; lends one to each point and pins it to the point's version.

A fleet is idle only while no point holds its :class:`~actorsys.actors.point.FleetLease`: the
pinner lends it when it takes the next point, and gets it back over the fleet pool's channel
(the supervisor owns it; whoever holds the point when it is done with it sends the fleet back,
:func:`give_back`): the EvalRunner after the evaluation, or the pinner itself when the pin
fails or the point is dropped. So a fleet is never pinned while an evaluation runs on it.

A pin is done, and the point goes on to be evaluated, once every engine reads the version
back. The probe's verdict (the engines' answers judged against the snapshot's own, computed
by the supervisor's one reference worker, a process the pinner starts when it starts, if a
fleet has engines to probe, and kills when its loop ends; on a shared fleet, against each
other) is the pinner's to deliver: it runs in the pinner's nursery of verdicts, within the
point's pin deadline, and reaches the point's holder through the lease
(``FleetLease.verdict``). So nothing the probe costs delays the evaluation, and the point
still settles only after the verdict.

A supervisor with shared fleets runs a second pinner over them (``shared=True``): it takes
only ``served`` points, which skip the Exporter, and waits at the weight gate
(:mod:`actorsys._core.weight_gate`, through ``gate``) before it lends a fleet, so no
evaluation starts on a shared fleet while the trainer updates its weights.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence

import trio

from actorsys.actors.flight import Flight
from actorsys.actors.point import FleetLease, Point, Source, State, Ticket
from actorsys.actors.retirer import Retirer
from actorsys.actors.stage import Done, Result, SequentialStage, Skip
from actorsys.actors.weight_gate import WeightGate
from actorsys.config import EvalConfig
from actorsys.fleet import Fleet, PinError
from actorsys.fleet.pin.reference import ReferenceWorker
from actorsys.fleet.pin.verdict import PinVerdict
from actorsys.outcome import PIN_TIME_SECONDS

NAME = "pinner"
SHARED_NAME = "shared-pinner"
SHARED_PIN_GRACE = 1.0
"""Seconds past the pin deadline a shared pin may take to report that a version never read
back (``pin_violation``) before the deadline itself cuts it off (``pin_timeout``)."""
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
        returns: FleetReturns,
        *,
        warm_references: bool = False,
        gate: WeightGate | None = None,
    ) -> None:
        super().__init__(flight, retirer)
        if gate is not None:
            self.name = SHARED_NAME
        self._gate = gate
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
        """An idle fleet for ``point``; the shared pinner lends one only while the weight gate
        lets the point start (a fleet received meanwhile goes back if the gate closed)."""
        while True:
            if self._gate is not None:
                await self._gate.wait_startable(point.step)
            fleet = await self._idle.receive()
            if self._gate is None or self._gate.startable(point.step):
                break
            self._returns.send(fleet)
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
        if point.source is Source.SERVED:
            return await self._pin_served(point, fleet)
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


    async def _pin_served(self, point: Point, fleet: Fleet) -> Result:
        """Pin a shared fleet to the version it serves (:meth:`Fleet.pin_served`): no load."""
        assert point.lease is not None and point.weight_version is not None
        assert self._verdicts is not None
        config = self.config
        deadline = trio.current_time() + config.pin_timeout
        base = None if config.base_checkpoint is None else str(config.base_checkpoint)
        with trio.move_on_at(deadline + SHARED_PIN_GRACE) as scope:
            try:
                verdict: PinVerdict = await self._verdicts.start(
                    functools.partial(
                        fleet.pin_served, point.weight_version, probe=config.probe,
                        prompts_from=base, deadline=deadline,
                    )
                )
            except PinError as exc:
                return Skip(exc.reason, str(exc), point)
        if scope.cancelled_caught:
            message = f"pin of {fleet!r} took longer than {config.pin_timeout} s"
            return Skip("pin_timeout", message, point)
        lease = dataclasses.replace(point.lease, verdict=verdict)
        return Done(point.but(lease=lease))


class FleetReturns:
    """Where a fleet goes back once its point is done with it: the channel of the idle
    fleets of its kind (shared fleets have a pool and a pinner of their own). Sending never
    waits (each channel has room for all its fleets)."""

    def __init__(
        self,
        dedicated: trio.MemorySendChannel[Fleet | None],
        shared: trio.MemorySendChannel[Fleet | None] | None = None,
    ) -> None:
        self.dedicated = dedicated
        self.shared = shared

    def send(self, fleet: Fleet | None) -> None:
        if fleet is not None and fleet.shared:
            assert self.shared is not None
            self.shared.send_nowait(fleet)
        else:
            self.dedicated.send_nowait(fleet)

    def clone(self) -> FleetReturns:
        return FleetReturns(
            self.dedicated.clone(), None if self.shared is None else self.shared.clone()
        )


def fleet_pool(
    fleets: Sequence[Fleet | None],
) -> tuple[trio.MemorySendChannel[Fleet | None], trio.MemoryReceiveChannel[Fleet | None]]:
    """The channel of idle fleets, holding every fleet (room for all, so a return never
    waits)."""
    returns, idle = trio.open_memory_channel[Fleet | None](max(1, len(fleets)))
    for fleet in fleets:
        returns.send_nowait(fleet)
    return returns, idle


def give_back(point: Point, returns: FleetReturns) -> Point:
    """``point`` without its fleet, sent back over ``returns``: its evaluation (or failed
    pin) is over, the fleet is idle again."""
    if point.lease is None:
        return point
    returns.send(point.lease.fleet)
    return point.but(lease=None)

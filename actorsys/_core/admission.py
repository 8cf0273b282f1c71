"""Admission: the slots of ``max_in_flight``, the overflow policy, the disk and buffer checks.

A step takes a slot when it is reserved and keeps it until the Retirer has deleted its files.
Between reserve and launch (the weight copy, in whichever thread the caller is on) the slot
is *reserved*; ``launch`` turns it into the point's ticket, ``release`` gives it back. A point
refused at admission (``busy``, ``disk_budget``, or a launch after close) is settled by the
Retirer at once and never enters the pipeline.

Each launched point is told to the supervisor's journal (:mod:`actorsys._core.journal`). The
points a crashed run left unsettled that are evaluated again (:mod:`actorsys._core.resume`)
enter at open through :meth:`Admission.resume`, ahead of any ``submit``, and take no slot
(their snapshots exist already); a ``submit`` of one of their steps admits nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from actorsys._core.disk_room import DiskRoom
from actorsys._core.journal import Journal
from actorsys._core.submit import DEDICATED_ONLY, FleetKinds, SubmitRequest, check_submit
from actorsys._errors import SupervisorClosedError, SupervisorGaveUpError
from actorsys.actors.flight import Flight
from actorsys.actors.point import Point, Source, State
from actorsys.actors.retirer import Retirer
from actorsys.actors.weight_gate import WeightGate
from actorsys.config import EvalConfig
from actorsys.runtime import ThreadTracker
from actorsys.snapshot import BufferLease, BufferPool, CapturedWeights, StatePlan

log = logging.getLogger("actorsys")



@dataclass(frozen=True)
class Reservation:
    """A slot held for a point between admission and launch (the weight copy happens in
    between, in whichever thread the caller is on, into ``buffers``: a set leased from the
    supervisor's pool; pass it to ``capture`` with ``plan``, the plan it was sized from)."""

    point: Point
    nbytes: int
    buffers: BufferLease | None = None
    plan: StatePlan | None = None


class Admission:
    def __init__(
        self,
        config: EvalConfig,
        flight: Flight,
        retirer: Retirer,
        staging_dir: str | None,
        buffers: BufferPool,
        export_send: trio.MemorySendChannel[Point],
        tracker: ThreadTracker,
        *,
        fleets: FleetKinds = DEDICATED_ONLY,
        served_send: trio.MemorySendChannel[Point] | None = None,
        gate: WeightGate | None = None,
        journal: Journal | None = None,
    ) -> None:
        self.config = config
        self.journal = journal
        self.resumed: set[int] = set()
        self.flight = flight
        self.retirer = retirer
        self.staging_dir = staging_dir
        self.buffers = buffers
        self.closing = False
        self.gave_up: Exception | None = None
        self._export_send = export_send
        self.fleets = fleets
        self._served_send = served_send
        self.gate = gate
        self.disk = None if staging_dir is None else DiskRoom(staging_dir, self._pending_bytes, tracker)
        self._steps: set[int] = set()
        self._reserved = 0

    def check_open(self) -> None:
        if self.gave_up is not None:
            raise SupervisorGaveUpError(
                "the supervisor gave up after too many actor crashes; it admits nothing more"
            ) from self.gave_up
        if self.closing:
            raise SupervisorClosedError("the supervisor is closed; it admits nothing more")

    async def reserve(self, request: SubmitRequest) -> Reservation | None:
        """Validate, wait for a slot, check the disk, lease a buffer set for the weights.

        None if the point settled at once instead, or its step is being resumed. Cancelling
        the wait admits nothing.
        """
        self.check_open()
        if request.step in self.resumed:
            log.info("step %d is evaluated from the snapshot of the run that crashed; this "
                     "submit admits nothing", request.step)
            return None
        point, plan = check_submit(request, self.config, self._steps, self.fleets)
        nbytes = 0 if plan is None else plan.nbytes
        self._steps.add(point.step)
        self.retirer.note_step(point.step)
        try:
            admitted = await self._take_slot(point)
        except BaseException:
            self._steps.discard(point.step)
            raise
        if not admitted:
            return None
        reservation: Reservation | None = None
        counted = 0
        try:
            if nbytes and not await self._disk_has_room(nbytes):
                error = f"{nbytes} bytes do not fit on {self.staging_dir}"
                self._settle_at_once(point, "disk_budget", error)
            elif plan is None:
                reservation = Reservation(point, nbytes)
            else:
                counted = nbytes
                buffers = await self._lease_buffers(point, plan)
                if buffers is not None:
                    reservation = Reservation(point, nbytes, buffers, plan)
        except BaseException:
            self._steps.discard(point.step)
            raise
        finally:
            if reservation is None:
                self._free_reserved(counted)
        return reservation

    def launch(self, reservation: Reservation, weights: CapturedWeights | None) -> bool:
        """Start a reserved point down the pipeline with its copied ``weights``; after a
        close or a give-up it settles ``closed`` / ``crashed`` instead (False)."""
        self._reserved -= 1
        point = reservation.point
        if self.closing or self.gave_up is not None:
            if weights is not None:
                weights.release()
            elif reservation.buffers is not None:
                reservation.buffers.give_back()
            self._settle_at_once(point, "closed" if self.gave_up is None else "crashed", None)
            self._left(reservation.nbytes)
            return False
        point = point.but(weights=weights)
        ticket = self.flight.admit(point)
        if self.journal is not None:
            self.journal.admitted(point)
        if point.source is Source.SERVED:
            # Nothing to export: straight to the shared fleets' pinner, in the gate's order.
            assert self._served_send is not None and self.gate is not None
            ticket.state = State.PIN
            self.gate.admitted(point.step)
            self._served_send.send_nowait(point)
        else:
            self._export_send.send_nowait(point)
        log.info("step %d admitted (%s)", point.step, point.source.value)
        return True

    def resume(self, points: Sequence[Point]) -> None:
        """Launch ``points``, a crashed run's, to be evaluated again ahead of any new point
        (:mod:`actorsys._core.resume`). Sync; at open, before the first ``submit``."""
        for point in points:
            self._steps.add(point.step)
            self.resumed.add(point.step)
            self.flight.admit(point)
            if self.journal is not None:
                self.journal.admitted(point, resumed=True)
            self._export_send.send_nowait(point)
            log.info("step %d resumed (%s)", point.step, point.source.value)

    def release(self, reservation: Reservation) -> None:
        """Give back a reservation that will not be launched; the step may be submitted again."""
        self._steps.discard(reservation.point.step)
        if reservation.buffers is not None:
            reservation.buffers.give_back()
        self._free_reserved(reservation.nbytes)

    def _free_reserved(self, nbytes: int) -> None:
        self._reserved -= 1
        self._left(nbytes)
        self.flight.wake()

    def _left(self, nbytes: int) -> None:
        if self.disk is not None and nbytes:
            self.disk.left(nbytes)

    def _settle_at_once(self, point: Point, reason: str, error: str | None) -> None:
        """Refuse ``point``: it settles before this returns, so its outcome is in the sink
        when ``submit`` returns False."""
        ticket = self.flight.admit(point)
        self.retirer.take(ticket, point.skipped(reason, error), at_once=True)

    def _full(self, *, settling_counts: bool) -> bool:
        taken = len(self.flight) if settling_counts else len(self.flight.unsettled())
        return taken + self._reserved >= self.config.max_in_flight

    async def _take_slot(self, point: Point) -> bool:
        """Wait for a free slot. Slots whose points settled and only wait for their files to
        be deleted are waited for under every policy; under ``skip`` a slot held by a point
        still being evaluated settles the new point ``busy``."""
        config = self.config
        while self._full(settling_counts=True):
            if not point.force and self._full(settling_counts=False):
                if config.overflow == "skip":
                    error = f"{config.max_in_flight} points already in flight"
                    self._settle_at_once(point, "busy", error)
                    return False
                if config.overflow == "latest":
                    for ticket in self.flight:
                        if ticket.supersedable:
                            ticket.drop("superseded", f"superseded by step {point.step}")
            await self.flight.wait_changed()
            self.check_open()
        self._reserved += 1
        return True

    async def _lease_buffers(self, point: Point, plan: StatePlan) -> BufferLease | None:
        """Lease the buffer set the copy goes into (one per slot). Only a set that an export
        thread abandoned at a timeout or supersede still reads can be missing: wait for that
        thread to stop (it does at its next chunk), or under ``overflow="skip"`` settle
        ``busy``."""
        while True:
            lease = self.buffers.try_lease(plan.buffer_nbytes, pinned=plan.on_cuda)
            if lease is not None:
                return lease
            if not point.force and self.config.overflow == "skip":
                self._settle_at_once(point, "busy", "every weight buffer is read by an abandoned export")
                return None
            await self.flight.wait_changed()
            self.check_open()

    async def _disk_has_room(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit on the staging dir's file system, beside the exports
        still to be written (:mod:`actorsys._core.disk_room`: an estimate, or ``statvfs`` in a
        worker thread when it comes close)."""
        assert self.disk is not None
        return await self.disk.has_room(nbytes)

    def _pending_bytes(self) -> int:
        return sum(
            ticket.point.weights.nbytes
            for ticket in self.flight
            if ticket.state is State.EXPORT and ticket.point.weights is not None
        )

"""Retirer: settles every point exactly once; owns the sink, the counters and the snapshot ring.

A point enters the Retirer through one door, :meth:`Retirer.take`: over the Retirer's inbox (a
memory channel the supervisor owns), so the Retirer's task settles points in the order they
came (and so do the late copies of points that settled already, ``discard``: only their files
are deleted). Two callers need the outcome recorded before they return, and ask ``take`` for it
``at_once``: admission, for a point it refuses (``busy``, ``disk_budget``: the outcome is in the
sink when ``submit`` returns False), and :meth:`Retirer.settle_now` (a close out of budget, a
supervisor that gave up: the owners may be stuck or gone). The one place a point settles is
``_settle``.

Settling is quick and never blocks: the outcome goes to the sink (whose ``record`` is
non-blocking by contract), the counters and the ring change, and the files to delete (a
skipped point's snapshot, or the oldest one the ring lets go) join the Retirer's own queue of
deletes. A background task deletes them in a worker thread, one step at a time, and only then
frees the step's slot: admission never lets more snapshots exist than ``keep_snapshots +
keep_best + max_in_flight``, and the trio thread never waits on a multi-GB ``rmtree``.

Beside the ring, the :class:`~actorsys.actors.best.BestKeeper` keeps the snapshots of the
best points (``keep_best``): the Retirer deletes none it keeps, retires those it lets go
(unless the ring still holds them), and writes ``hf_dir/best.json`` in the delete thread
before the deletes of the same settle.

Every point that settles is told to the supervisor's journal (:class:`SettleJournal`), after
the sink: the line is queued at once, written by the journal's writer task (run in the
Retirer's nursery) and, before any delete, by the delete thread, so a snapshot is never deleted
while the journal on disk still shows its point unsettled.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from dataclasses import dataclass
from typing import Protocol

import trio

from actorsys import staging
from actorsys.actors.best import BEST_JSON, BestKeeper, write_record
from actorsys.actors.flight import Flight
from actorsys.actors.point import Point, State, Ticket
from actorsys.config import EvalConfig
from actorsys.outcome import LAG_STEPS, Outcome
from actorsys.runtime import ThreadTracker, run_blocking
from actorsys.sinks import Sink

log = logging.getLogger("actorsys")

NAME = "retirer"


class SettleJournal(Protocol):
    """Where settled points are journaled (the supervisor's :mod:`actorsys._core.journal`)."""

    def settled(self, outcome: Outcome) -> None:
        """Queue the line (sync, no file touched)."""

    def write_pending(self) -> None:
        """Write the queued lines (blocking: in a worker thread)."""

    async def flush(self) -> None:
        """Write the queued lines in a worker thread."""

    async def run(self) -> None:
        """Write lines as they are queued, until cancelled."""


@dataclass(frozen=True)
class Discard:
    """A message to the Retirer: delete what this late copy of a settled point wrote."""

    point: Point


class Retirer:
    name = NAME

    def __init__(
        self, config: EvalConfig, flight: Flight, sink: Sink, tracker: ThreadTracker,
        staging_dir: str | None = None,
        journal: SettleJournal | None = None,
    ) -> None:
        self.config = config
        self.journal = journal
        self.flight = flight
        self.sink = sink
        self.tracker = tracker
        self.inbox_send, self.inbox = trio.open_memory_channel[Point | Discard](float("inf"))
        self.ring: deque[str] = deque()
        self.reasons: Counter[str] = Counter()
        self.ok_count = 0
        self.settled_steps: set[int] = set()
        self.noted_step: int | None = None
        self.best = BestKeeper(config, staging_dir)
        self._deletes: deque[tuple[int | None, list[str], bytes | None]] = deque()
        self._queued = trio.lowlevel.ParkingLot()
        self._limiter = trio.CapacityLimiter(1)
        self._loop_ended = trio.Event()
        self._loop_ended.set()

    # -- messages ---------------------------------------------------------------------

    def take(self, ticket: Ticket, point: Point, *, at_once: bool = False) -> None:
        """A point comes to settle: from now on the Retirer owns it. Sent over the inbox;
        ``at_once`` settles it before this returns."""
        ticket.state, ticket.owner, ticket.point = State.SETTLE, self, point
        if not at_once:
            try:
                self.inbox_send.send_nowait(point)
                return
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                pass
        self._settle(point)

    def dropped(self, ticket: Ticket) -> None:
        return None

    def discard(self, point: Point) -> None:
        """A copy of a point that settled while its owner still worked on it: delete the
        snapshot it may have written since, unless the ring keeps it. Never settles. Sent
        over the inbox too."""
        try:
            self.inbox_send.send_nowait(Discard(point))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._discard(point)

    def note_step(self, step: int) -> None:
        if self.noted_step is None or step > self.noted_step:
            self.noted_step = step

    # -- the actor --------------------------------------------------------------------

    async def run(self, inbox: trio.MemoryReceiveChannel[Point | Discard]) -> None:
        async with inbox, trio.open_nursery() as nursery:
            self._loop_ended = trio.Event()
            nursery.start_soon(self._delete_loop)
            if self.journal is not None:
                nursery.start_soon(self.journal.run)
            async for message in inbox:
                self._handle(message)
            await self._wait_deleted()
            if self.journal is not None:
                await self.journal.flush()
            nursery.cancel_scope.cancel()

    def _settle(self, point: Point) -> None:
        """Record ``point``'s outcome and queue its deletes. Sync and non-blocking; a point
        whose ticket settled already only has its leftovers deleted."""
        ticket = self.flight.get(point.step)
        if ticket is None or ticket.state is State.SETTLED:
            self._discard(point)
            return
        ticket.state, ticket.owner, ticket.point = State.SETTLED, None, point
        if point.weights is not None:
            point.weights.release()
        outcome = self._outcome(point)
        best = self.best.offer(outcome, owned=point.owned)
        self.settled_steps.add(point.step)
        if outcome.ok:
            self.ok_count += 1
        else:
            self.reasons[outcome.reason or "unknown"] += 1
        try:
            self.sink.record(outcome)
        except Exception:
            log.exception("sink %r failed to record step %d", self.sink, point.step)
        if self.journal is not None:
            self.journal.settled(outcome)
        doomed = self._doomed(point, keep=outcome.ok)
        doomed += [path for path in best.displaced if path not in self.ring]
        self._queue_delete(point.step, doomed, best.record)
        self.flight.wake()
        log.info(
            "step %d settled %s%s", point.step, outcome.status,
            f" ({outcome.reason})" if outcome.reason else "",
        )

    def _handle(self, message: Point | Discard) -> None:
        if isinstance(message, Discard):
            self._discard(message.point)
        else:
            self._settle(message)

    def _handle_queued(self) -> None:
        """Handle what the inbox still holds after the Retirer's task was cancelled (at close,
        when the actors did not stop in time)."""
        while True:
            try:
                message = self.inbox.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            self._handle(message)

    def _discard(self, point: Point) -> None:
        if point.weights is not None:
            point.weights.release()
        kept = (*self.ring, *self.best.kept)
        self._queue_delete(None, [path for path in point.files if path not in kept])

    def settle_now(self, reason: str, error: str | None = None) -> list[int]:
        """Settle every point in flight here and now, without waiting for its owner (which
        may be stuck or gone): for a close whose budget ran out, or a supervisor that gave
        up. Points already on their way to settle keep their own outcome; the others settle
        ``reason`` and their owners are cancelled. Returns the steps cut off."""
        cut = []
        for ticket in self.flight:
            if ticket.state is State.SETTLED:
                continue
            point = ticket.point
            if ticket.drop(reason, error):
                cut.append(ticket.step)
                point = point.skipped(reason, error)
            self.take(ticket, point, at_once=True)
        return sorted(cut)

    async def delete_leftovers(self) -> None:
        """Delete, in this task, whatever the delete loop has not got to: at close, once the
        actors were cancelled (this first waits for the loop to end, after the delete it may
        be running)."""
        await self._loop_ended.wait()
        self._handle_queued()
        while self._deletes:
            await self._delete(*self._deletes.popleft())
        if self.journal is not None:
            await self.journal.flush()

    # -- deleting ---------------------------------------------------------------------

    def _doomed(self, point: Point, *, keep: bool) -> list[str]:
        doomed = [point.scratch] if point.scratch is not None else []
        if not point.owned:
            return doomed
        assert point.snapshot is not None
        if not keep or self.config.keep_snapshots == 0:
            return [*doomed, point.snapshot]  # (unless the best keep it: _queue_delete)
        self.ring.append(point.snapshot)
        while len(self.ring) > self.config.keep_snapshots:
            doomed.append(self.ring.popleft())
        return doomed

    def _queue_delete(self, step: int | None, paths: list[str], record: bytes | None = None) -> None:
        paths = [path for path in dict.fromkeys(paths) if path not in self.best.kept]
        if not paths and record is None:
            if step is not None:
                self.flight.free(step)
            return
        self._deletes.append((step, paths, record))
        self._queued.unpark_all()

    async def _delete_loop(self) -> None:
        try:
            while True:
                while not self._deletes:
                    await self._queued.park()
                job = self._deletes.popleft()
                try:
                    await self._delete(*job)
                except trio.Cancelled:
                    # Cancelled before its thread started: the delete is still to be done.
                    self._deletes.appendleft(job)
                    raise
                self._queued.unpark_all()
        finally:
            self._loop_ended.set()

    async def _wait_deleted(self) -> None:
        while self._deletes or self._limiter.borrowed_tokens:
            await self._queued.park()

    async def _delete(self, step: int | None, paths: list[str], record: bytes | None) -> None:
        if paths or record is not None:
            await run_blocking(
                lambda: self._retire_all(paths, record),
                abandon_on_cancel=False,
                limiter=self._limiter,
                description=f"retire of {', '.join(paths) or BEST_JSON}",
                tracker=self.tracker,
            )
        if step is not None:
            self.flight.free(step)

    def _outcome(self, point: Point) -> Outcome:
        metrics = dict(point.metrics)
        if self.noted_step is not None:
            metrics[LAG_STEPS] = float(self.noted_step - point.step)
        if point.reason is None and point.output is not None:
            metrics.update(point.output.metrics or {})
            return Outcome(
                step=point.step,
                status="ok",
                metrics=metrics,
                data=point.output.data,
                weight_version=point.weight_version,
                snapshot=point.snapshot,
            )
        return Outcome(
            step=point.step,
            status="skipped",
            reason=point.reason or "crashed",
            metrics=metrics,
            data={"error": point.error} if point.error else None,
            snapshot=point.snapshot,
        )

    def _retire_all(self, paths: list[str], record: bytes | None) -> None:
        """Write the journal's queued lines and ``best.json`` (first: neither names a snapshot
        already gone, nor leaves a point unsettled whose snapshot is gone), then retire."""
        if self.journal is not None:
            self.journal.write_pending()
        if record is not None and self.best.path is not None:
            try:
                write_record(self.best.path, record)
            except (OSError, ValueError):  # UnsafePathError is a ValueError
                log.exception("could not write %s", self.best.path)
        for path in paths:
            staging.retire(path)

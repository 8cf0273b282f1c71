"""The pipeline's shared state: points in flight, their hand-offs, and settling.

Actors own no point state of their own. A point is always in exactly one place: a channel
buffer, or *held* by one actor (``hold``). Whoever drops a point (supersede, close, a crash)
either cancels the holder's work, and the holder forwards the point to the Retirer, or, when
nobody holds it, forwards it at once; receivers skip points already dropped. ``settle`` is
idempotent, so a point settles exactly once whichever path reaches it first.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import trio

from actorsys import staging
from actorsys._point import Point, Stage
from actorsys.config import EvalConfig
from actorsys.fleet import Fleet
from actorsys.outcome import LAG_STEPS, Outcome
from actorsys.runtime import ThreadTracker
from actorsys.sinks import Sink
from actorsys.snapshot import BufferPool

log = logging.getLogger("actorsys")


class Pipeline:
    """Channels, the in-flight table, the fleet pool and the snapshot ring of one supervisor."""

    def __init__(
        self,
        config: EvalConfig,
        sink: Sink,
        fleets: Sequence[Fleet | None],
        staging_dir: str | None,
    ) -> None:
        self.config = config
        self.sink = sink
        self.staging_dir = staging_dir
        self.tracker = ThreadTracker()
        self._token = trio.lowlevel.current_trio_token()
        self.buffers = BufferPool(
            config.max_in_flight, on_free=self._wake_from_any_thread, prepare_spares=True
        )
        self.export_send, self.export_recv = trio.open_memory_channel[Point](math.inf)
        self.pin_send, self.pin_recv = trio.open_memory_channel[Point](math.inf)
        self.eval_send, self.eval_recv = trio.open_memory_channel[Point](math.inf)
        self.retire_send, self.retire_recv = trio.open_memory_channel[Point](math.inf)
        self.pool_send, self.pool_recv = trio.open_memory_channel[Fleet | None](len(fleets))
        for fleet in fleets:
            self.pool_send.send_nowait(fleet)
        self.in_flight: dict[int, Point] = {}
        self.settled_steps: set[int] = set()
        self.noted_step: int | None = None
        self.ring: deque[str] = deque()
        self.reasons: Counter[str] = Counter()
        self.ok_count = 0
        self._changed = trio.lowlevel.ParkingLot()

    # -- ownership ----------------------------------------------------------------------

    @contextmanager
    def hold(self, point: Point, holder: str) -> Iterator[trio.CancelScope]:
        """Hold ``point`` for one stage of work, cancellable through ``point.scope``.

        On a normal exit (the work finished, failed, or was cancelled by a drop) the holder
        must ``release`` the point. If the holder itself crashes, the point stays marked as
        held by it, for ``holder_crashed`` to find.
        """
        point.holder = holder
        with trio.CancelScope() as scope:
            point.scope = scope
            try:
                yield scope
            finally:
                point.scope = None
        point.holder = None

    def release(self, point: Point, onward: trio.MemorySendChannel[Point], stage: Stage) -> None:
        """Send a point its holder is done with to ``stage`` through ``onward``, or to the
        Retirer if it was dropped or failed on the way."""
        if point.stage is Stage.SETTLED:
            self._retire_snapshot(point)
            return
        if point.drop_reason is not None:
            self.return_fleet(point)
            point.stage = Stage.SETTLE
            self.retire_send.send_nowait(point)
        else:
            point.stage = stage
            onward.send_nowait(point)

    def fail(self, point: Point, reason: str, error: str | None = None) -> None:
        """The holder's own work failed: record why; ``release`` forwards it to settle."""
        if point.drop_reason is None:
            point.drop_reason = reason
            point.error = error

    def drop(self, point: Point, reason: str, error: str | None = None) -> bool:
        """Take ``point`` out of the pipeline from outside: cancel its holder's work, or
        forward it to the Retirer if nobody holds it. False if it was already on its way out."""
        if point.drop_reason is not None or point.stage in (Stage.SETTLE, Stage.SETTLED):
            return False
        point.drop_reason = reason
        point.error = error
        if point.scope is not None:
            point.scope.cancel()
        elif point.holder is None:
            point.stage = Stage.SETTLE
            self.retire_send.send_nowait(point)
        return True

    def holder_crashed(self, holder: str, exc: Exception) -> None:
        """An actor crashed: every point it held settles ``crashed``."""
        for point in list(self.in_flight.values()):
            if point.holder == holder:
                point.holder = None
                if not self.drop(point, "crashed", f"actor {holder} crashed: {exc!r}"):
                    point.stage = Stage.SETTLE
                    self.retire_send.send_nowait(point)

    # -- the fleet pool -----------------------------------------------------------------

    def lease_fleet(self, point: Point, fleet: Fleet | None) -> None:
        point.fleet = fleet
        point.fleet_leased = True

    def return_fleet(self, point: Point) -> None:
        if point.fleet_leased:
            point.fleet_leased = False
            self.pool_send.send_nowait(point.fleet)

    # -- admission ----------------------------------------------------------------------

    def note_step(self, step: int) -> None:
        if self.noted_step is None or step > self.noted_step:
            self.noted_step = step

    def admit(self, point: Point) -> None:
        self.in_flight[point.step] = point
        self.export_send.send_nowait(point)

    async def wait_changed(self) -> None:
        """Block until a point settles (or ``wake`` is called)."""
        await self._changed.park()

    def wake(self) -> None:
        self._changed.unpark_all()

    def _wake_from_any_thread(self) -> None:
        try:
            self._token.run_sync_soon(self.wake)
        except trio.RunFinishedError:
            pass

    # -- settling -----------------------------------------------------------------------

    def settle(self, point: Point) -> Outcome | None:
        """Record ``point``'s outcome, retire its snapshot and free its slot. Idempotent:
        None if it had settled already. Sync and non-blocking but for deleting files."""
        if point.stage is Stage.SETTLED:
            return None
        point.stage = Stage.SETTLED
        outcome = self._outcome(point)
        self.return_fleet(point)
        point.release_weights()
        self.in_flight.pop(point.step, None)
        self.settled_steps.add(point.step)
        if outcome.ok:
            self.ok_count += 1
        else:
            self.reasons[outcome.reason or "unknown"] += 1
        try:
            self.sink.record(outcome)
        except Exception:
            log.exception("sink %r failed to record step %d", self.sink, point.step)
        self._retire_snapshot(point, keep=outcome.ok)
        self.wake()
        log.info(
            "step %d settled %s%s", point.step, outcome.status,
            f" ({outcome.reason})" if outcome.reason else "",
        )
        return outcome

    def _outcome(self, point: Point) -> Outcome:
        metrics = dict(point.metrics)
        if self.noted_step is not None:
            metrics[LAG_STEPS] = float(self.noted_step - point.step)
        if point.drop_reason is None and point.output is not None:
            metrics.update(point.output.metrics or {})
            return Outcome(
                step=point.step,
                status="ok",
                metrics=metrics,
                data=point.output.data,
                weight_version=point.weight_version,
                snapshot=point.snapshot,
            )
        reason = point.drop_reason or "crashed"
        return Outcome(
            step=point.step,
            status="skipped",
            reason=reason,
            metrics=metrics,
            data={"error": point.error} if point.error else None,
            snapshot=point.snapshot,
        )

    def _retire_snapshot(self, point: Point, *, keep: bool = False) -> None:
        if not point.owned or point.snapshot is None:
            return
        path, point.snapshot, point.owned = point.snapshot, None, False
        if keep and self.config.keep_snapshots > 0:
            point.snapshot = path
            self.ring.append(path)
            while len(self.ring) > self.config.keep_snapshots:
                staging.retire(self.ring.popleft())
        else:
            staging.retire(path)

    def settle_now(self, reason: str, error: str | None = None) -> list[int]:
        """Drop every point in flight with ``reason`` and settle it here and now, without the
        actors (which may be stuck or gone). Returns the steps that were cut off."""
        cut = []
        for point in list(self.in_flight.values()):
            if self.drop(point, reason, error):
                cut.append(point.step)
            self.settle(point)
        return sorted(cut)


"""The watch loop: complete checkpoints under a directory, evaluated once each, in step order.

The loop scans, asks the ledger which checkpoints are still due under this eval key, and
submits them to an :class:`~actorsys.EvalSupervisor` as ``checkpoint_dir=`` sources (never
deleted), one eval per fleet at a time, several fleets in parallel. Outcomes may settle out
of order across fleets; they are written to the ledger and to ``metrics.jsonl`` in the order
the checkpoints were submitted (step order), so the ledger's "done" only ever grows in step
order. A supervisor accepts a step once, so a retry (or a second directory of the same step)
waits for the next *generation*: a fresh supervisor on the same fleets, opened once the
current one has nothing in flight.

Every file operation (scans, ledger, metrics, the lock) runs in a worker thread; a scan or a
write stuck on a hung filesystem is abandoned when the watcher is cancelled or interrupted,
so it can never hold Ctrl-C past the close budget.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, TypeVar

import trio

from actorsys._errors import SupervisorClosedError
from actorsys.config import EvalConfig
from actorsys.fleet.engine import Fleet
from actorsys.outcome import Outcome
from actorsys.runtime import ThreadTracker, run_blocking
from actorsys.sinks import JsonlSink, Sink
from actorsys.sinks.fanout import CallbackSink, FanoutSink
from actorsys.supervisor import EvalSupervisor
from actorsys.watch.ledger import DONE, FAILED, SKIPPED, VANISHED, Ledger
from actorsys.watch.lock import OutLock
from actorsys.watch.scan import Checkpoint, Completion, Scanner

log = logging.getLogger("actorsys.watch")

T = TypeVar("T")
Catchup = Literal["all", "latest"]
FleetsFor = Callable[[Checkpoint], AbstractAsyncContextManager[Sequence[Fleet]]]
CLOSED = "closed"
BAD_REQUEST = "bad_request"
"""A point whose requests the server refused as malformed: it can never succeed, so it is
recorded failed at its first attempt."""
WATCH_OWNED_FIELDS = ("hf_dir", "save_hf", "base_checkpoint", "max_in_flight", "overflow",
                      "keep_snapshots")
"""The :class:`EvalConfig` fields the watcher sets itself: it evaluates checkpoints in place,
one per fleet at a time, and never drops or deletes one."""


@dataclass(frozen=True)
class WatchSettings:
    """``config``: the eval settings (timeouts, probe, ...), as a trainer's flags give them;
    the fields in ``WATCH_OWNED_FIELDS`` are the watcher's own. ``marker`` and
    ``quiet_seconds``: when a checkpoint is complete (see :class:`Completion`)."""

    root: str
    out: str
    catchup: Catchup = "all"
    once: bool = False
    poll_interval: float = 10.0
    quiet_seconds: float | None = None
    marker: str | None = None
    max_attempts: int = 3
    config: EvalConfig = field(default_factory=EvalConfig)


@dataclass(frozen=True)
class WatchedOutcome(Outcome):
    """An outcome as ``metrics.jsonl`` keeps it: with the checkpoint's name and fingerprint,
    the attempt and the eval key."""

    checkpoint: str = ""
    fingerprint: str = ""
    attempt: int | None = None
    eval_key: str = ""


@dataclass
class WatchReport:
    """What one run of the service did: steps evaluated ok, failed for good, vanished; and
    whether it was interrupted."""

    ok: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    vanished: list[int] = field(default_factory=list)
    interrupted: bool = False


class Watcher:
    """One watch service. ``run`` blocks until ``--once`` has processed the backlog, or until
    :meth:`interrupt`; cancelling ``run`` closes the supervisor within ``close_timeout``.
    ``run`` holds ``OUT/.lock`` (a second watcher on the same OUT raises
    :class:`~actorsys._errors.WatchOutInUseError` before it reads anything)."""

    def __init__(
        self,
        settings: WatchSettings,
        *,
        eval_fn: Any,
        eval_key: str,
        fleets_for: FleetsFor,
        sink: Sink | None = None,
    ) -> None:
        self.settings = settings
        self.eval_fn = eval_fn
        self.eval_key = eval_key
        self.fleets_for = fleets_for
        self.sink = sink
        self.scanner = Scanner(settings.root, Completion(settings.marker, settings.quiet_seconds))
        self.lock = OutLock(settings.out)
        self.metrics = JsonlSink(os.path.join(settings.out, "metrics.jsonl"))
        self._sink = FanoutSink([sink] if sink is not None else [])
        self.threads = ThreadTracker()
        self.report = WatchReport()
        self.started: dict[int, float] = {}
        self._ledger: Ledger | None = None
        self._closed = False
        self._token: trio.lowlevel.TrioToken | None = None
        self._scan_limiter = trio.CapacityLimiter(1)
        self._out_limiter = trio.CapacityLimiter(1)
        self._ignored: set[str] = set()
        self._order: list[Checkpoint] = []
        self._settled: dict[int, Outcome] = {}
        self._changed = trio.Event()
        self._wake_recorder = trio.Event()
        self._recorded = trio.Event()
        self._supervisor: EvalSupervisor | None = None
        self._cancel = trio.CancelScope()

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            raise RuntimeError("the ledger is read when run() starts")
        return self._ledger

    async def run(self) -> WatchReport:
        self._closed = False
        self._token = trio.lowlevel.current_trio_token()
        try:
            with self._cancel:
                await self._in_thread(self._out_limiter, self._open, "open the watch output")
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._record_settled)
                    due = await self._first_due()
                    if due:
                        async with self.fleets_for(due[0]) as fleets:
                            while await self._generation(list(fleets)):
                                pass
                    nursery.cancel_scope.cancel()
        finally:
            self._close()
        return self.report

    async def interrupt(self) -> None:
        """Cut off the points in flight (they settle ``closed``: not attempts, due again at
        the next start), record what settled, and stop ``run``. Returns within
        ``close_timeout``."""
        self.report.interrupted = True
        with trio.move_on_after(self.settings.config.close_timeout):
            if self._supervisor is not None:
                await self._supervisor.aclose(drain=False)
            while self._order:
                await self._recorded.wait()
        self._cancel.cancel()

    def _open(self) -> None:
        os.makedirs(self.settings.out, exist_ok=True)
        self.lock.acquire()
        if self._closed:  # run was cancelled and left this thread behind
            self.lock.release()
            return
        self._ledger = Ledger(os.path.join(self.settings.out, "ledger.jsonl"))

    def _close(self) -> None:
        """Close the files ``run`` opened. On the trio thread, so that the lock is surely let
        go when ``run`` returns: closing them writes nothing (every record was flushed, the
        lock's pid synced at acquire)."""
        self._closed = True
        try:
            self.metrics.close()
        finally:
            self.lock.release()

    async def _in_thread(self, limiter: trio.CapacityLimiter, fn: Callable[[], T],
                         description: str) -> T:
        """``fn()`` in a worker thread; abandoned (listed in ``threads`` until it ends) when
        the caller is cancelled: only scans and whole-line appends run this way."""
        return await run_blocking(fn, abandon_on_cancel=True, limiter=limiter,
                                  description=description, tracker=self.threads)

    # -- scanning ----------------------------------------------------------------------

    async def _scan(self) -> list[Checkpoint]:
        return await self._in_thread(
            self._scan_limiter, partial(self.scanner.scan, now=time.time()),
            f"scan {self.settings.root}",
        )

    async def _due(self, found: list[Checkpoint] | None = None) -> list[Checkpoint]:
        if found is None:
            found = await self._scan()
        claimed = {c.name for c in self._order}
        return [
            c for c in found
            if c.name not in self._ignored and c.name not in claimed
            and self.ledger.due(c.name, c.fingerprint, self.eval_key, self.settings.max_attempts)
        ]

    async def _first_due(self) -> list[Checkpoint]:
        while True:
            found = await self._scan()
            if self.settings.catchup == "latest" and found:
                newest = found[-1].step
                self._ignored = {c.name for c in found if c.step < newest}
                if self._ignored:
                    log.info("--catchup latest: leaving %d older checkpoints", len(self._ignored))
            due = await self._due(found)
            if due or self.settings.once:
                return due
            with trio.move_on_after(self.settings.poll_interval):
                await self._changed.wait()

    # -- one supervisor at a time ----------------------------------------------------------

    def _config(self, fleets: int) -> EvalConfig:
        return dataclasses.replace(
            self.settings.config,
            hf_dir=None,
            save_hf=None,
            base_checkpoint=None,
            max_in_flight=fleets + 1,
            overflow="backpressure",
            keep_snapshots=0,
        )

    async def _generation(self, fleets: list[Fleet]) -> bool:
        """Run one supervisor until nothing it can take is due; True if another generation
        is needed (a retry, or a second checkpoint of a step already submitted)."""
        submitted: set[int] = set()
        config = self._config(max(1, len(fleets)))
        async with EvalSupervisor.open(
            config, eval_fn=self.eval_fn, fleet=fleets or None, sink=CallbackSink(self.settled)
        ) as sup:
            self._supervisor = sup
            while True:
                due = await self._due()
                waiting = False
                for checkpoint in due:
                    if checkpoint.step in submitted:
                        waiting = True
                        continue
                    submitted.add(checkpoint.step)
                    self._order.append(checkpoint)
                    self.started[checkpoint.step] = time.time()
                    log.info("evaluating %s (step %d)", checkpoint.name, checkpoint.step)
                    try:
                        await sup.submit(
                            checkpoint.step,
                            checkpoint_dir=checkpoint.path,
                            require_marker=checkpoint.marked,
                        )
                    except SupervisorClosedError:
                        if self.report.interrupted:
                            return False
                        raise
                if not self._order:
                    if waiting:
                        return True
                    if self.settings.once:
                        return False
                with trio.move_on_after(self.settings.poll_interval):
                    await self._changed.wait()
                self._changed = trio.Event()

    # -- settling, in step order ---------------------------------------------------------

    def settled(self, outcome: Outcome) -> None:
        """An outcome from the supervisor's sink call, on whichever thread makes it; never
        blocks. The recorder task records it once every checkpoint submitted before it is."""
        if self._token is None:
            raise RuntimeError("outcomes are handed over only while run() runs")
        self._token.run_sync_soon(self._take, outcome)

    def _take(self, outcome: Outcome) -> None:
        self._settled[outcome.step] = outcome
        self._wake_recorder.set()

    async def _record_settled(self) -> None:
        """Write settled outcomes to the ledger, ``metrics.jsonl`` and the sink, in
        submission order, each in a worker thread. A checkpoint stays claimed (never
        submitted again) until its outcome is written."""
        while True:
            await self._wake_recorder.wait()
            self._wake_recorder = trio.Event()
            while self._order and self._order[0].step in self._settled:
                checkpoint = self._order[0]
                await self._record(checkpoint, self._settled.pop(checkpoint.step))
                self._order.pop(0)
                self._recorded.set()
                self._recorded = trio.Event()
                self._changed.set()

    async def _record(self, checkpoint: Checkpoint, outcome: Outcome) -> None:
        """The ledger and ``metrics.jsonl`` in a worker thread, then the sink on the trio
        thread, where the pipeline calls sinks too (a sink that raises is logged)."""
        vanished = False
        if not outcome.ok and outcome.reason != CLOSED:
            vanished = not await self._in_thread(
                self._out_limiter, partial(os.path.isdir, checkpoint.path),
                f"look for {checkpoint.path}",
            )
        attempt = self.ledger.history(checkpoint.name, checkpoint.fingerprint, self.eval_key).attempts + 1
        lines = self._ledger_lines(checkpoint, outcome, vanished=vanished)
        watched = WatchedOutcome(
            **{f.name: getattr(outcome, f.name) for f in dataclasses.fields(Outcome)},
            checkpoint=checkpoint.name, fingerprint=checkpoint.fingerprint, attempt=attempt,
            eval_key=self.eval_key,
        )
        await self._in_thread(
            self._out_limiter, partial(self._write, lines, watched), f"record {checkpoint.name}"
        )
        self._sink.record(watched)

    def _ledger_lines(self, checkpoint: Checkpoint, outcome: Outcome, *, vanished: bool) -> list[str]:
        """The ledger entries ``outcome`` makes (noted in the ledger's memory); the report."""
        ledger, key = self.ledger, self.eval_key
        note = partial(ledger.note, checkpoint.name, checkpoint.fingerprint, checkpoint.step, key)
        if outcome.ok:
            self.report.ok.append(checkpoint.step)
            return [note(DONE)]
        if outcome.reason == CLOSED:
            return []
        if vanished:
            self.report.vanished.append(checkpoint.step)
            return [note(VANISHED, reason=outcome.reason)]
        lines = [note(SKIPPED, reason=outcome.reason)]
        attempts = ledger.history(checkpoint.name, checkpoint.fingerprint, key).attempts
        error = error_of(outcome)
        if outcome.reason == BAD_REQUEST:
            lines.append(note(FAILED, reason=outcome.reason, error=error))
            self.report.failed.append(checkpoint.step)
            log.warning("%s can never be evaluated as asked (%s: %s); not retried",
                        checkpoint.name, outcome.reason, error)
        elif attempts >= self.settings.max_attempts:
            lines.append(note(FAILED, reason=outcome.reason))
            self.report.failed.append(checkpoint.step)
            log.warning("%s failed %d times (%s); not retried", checkpoint.name, attempts,
                        outcome.reason)
        return lines

    def _write(self, lines: list[str], outcome: WatchedOutcome) -> None:
        """Blocking: the ledger first (what a restart resumes from), then the row."""
        self.ledger.write(lines)
        self.metrics.record(outcome)


def error_of(outcome: Outcome) -> str | None:
    """The first error message an outcome carries (``data["error"]``), or None."""
    data = outcome.data
    error = data.get("error") if isinstance(data, dict) else None
    return None if error is None else str(error)


def eval_key(datasets: Sequence[Any]) -> str:
    """A short hash of the eval settings: every dataset's fingerprint (records and sampling
    settings), so a new dataset or a changed setting makes every checkpoint due again."""
    payload = json.dumps(sorted(dataset.fingerprint() for dataset in datasets)).encode()
    return hashlib.sha256(payload).hexdigest()[:16]

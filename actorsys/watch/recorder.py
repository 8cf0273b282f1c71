"""Settled outcomes of a watch run, recorded in the order their checkpoints were submitted.

Outcomes may settle out of order across fleets; the recorder writes each to the ledger (what a
restart resumes from), then to ``metrics.jsonl``, then to the sink, only once every checkpoint
submitted before it is recorded, so the ledger's "done" only ever grows in step order. A
checkpoint stays claimed (never submitted again) from its submission until its outcome is
written. What an outcome writes is :func:`~actorsys.watch.policy.settle`'s; the files are
written in worker threads, abandoned when the run is cancelled.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import partial
from typing import TypeVar

import trio

from actorsys.outcome import Outcome
from actorsys.runtime import ThreadTracker, run_blocking
from actorsys.sinks import JsonlSink, Sink
from actorsys.watch import policy
from actorsys.watch.ledger import Ledger
from actorsys.watch.policy import error_of
from actorsys.watch.scan import Checkpoint
from actorsys.watch.settings import WatchedOutcome, WatchReport

log = logging.getLogger("actorsys.watch")

T = TypeVar("T")


@dataclass(eq=False)
class Recorder:
    """The checkpoints submitted and not yet recorded (``order``, in submission order) and
    the outcomes settled for them. ``ledger()``: the run's ledger; ``metrics``, ``sink``:
    where each outcome's row goes; ``report``: the run's report, which each recorded outcome
    joins; ``on_recorded()``: called on the trio thread after each record. File work runs
    under ``limiter``, tracked in ``threads``."""

    eval_key: str
    max_attempts: int
    ledger: Callable[[], Ledger]
    metrics: JsonlSink
    sink: Sink
    report: WatchReport
    on_recorded: Callable[[], None]
    limiter: trio.CapacityLimiter
    threads: ThreadTracker
    order: list[Checkpoint] = field(default_factory=list, init=False)
    _settled: dict[int, Outcome] = field(default_factory=dict, init=False)
    _wake: trio.Event = field(default_factory=trio.Event, init=False)
    _recorded: trio.Event = field(default_factory=trio.Event, init=False)

    @property
    def claimed(self) -> set[str]:
        """The names of the checkpoints submitted and not yet recorded."""
        return {c.name for c in self.order}

    def claim(self, checkpoint: Checkpoint) -> None:
        """``checkpoint`` is submitted now: its outcome is recorded after those before it."""
        self.order.append(checkpoint)

    def take(self, outcome: Outcome) -> None:
        """An outcome settled (on the trio thread): recorded once its turn comes."""
        self._settled[outcome.step] = outcome
        self._wake.set()

    async def drained(self) -> None:
        """Until every claimed checkpoint is recorded."""
        while self.order:
            await self._recorded.wait()

    async def run(self) -> None:
        """Write settled outcomes to the ledger, ``metrics.jsonl`` and the sink, in
        submission order, each in a worker thread. A checkpoint stays claimed (never
        submitted again) until its outcome is written."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self.order and self.order[0].step in self._settled:
                checkpoint = self.order[0]
                await self._record(checkpoint, self._settled.pop(checkpoint.step))
                self.order.pop(0)
                self._recorded.set()
                self._recorded = trio.Event()
                self.on_recorded()

    async def _in_thread(self, fn: Callable[[], T], description: str) -> T:
        return await run_blocking(fn, abandon_on_cancel=True, limiter=self.limiter,
                                  description=description, tracker=self.threads)

    async def _record(self, checkpoint: Checkpoint, outcome: Outcome) -> None:
        """The ledger and ``metrics.jsonl`` in a worker thread, then the sink on the trio
        thread, where the pipeline calls sinks too (a sink that raises is logged)."""
        vanished = False
        if policy.needs_presence_check(outcome.ok, outcome.reason):
            vanished = not await self._in_thread(
                partial(os.path.isdir, checkpoint.path), f"look for {checkpoint.path}"
            )
        ledger = self.ledger()
        attempt = ledger.history(checkpoint.name, checkpoint.fingerprint, self.eval_key).attempts + 1
        lines = self._ledger_lines(ledger, checkpoint, outcome, vanished=vanished)
        watched = WatchedOutcome(
            **{f.name: getattr(outcome, f.name) for f in fields(Outcome)},
            checkpoint=checkpoint.name, fingerprint=checkpoint.fingerprint, attempt=attempt,
            eval_key=self.eval_key,
        )
        await self._in_thread(partial(self._write, ledger, lines, watched),
                              f"record {checkpoint.name}")
        self.sink.record(watched)

    def _ledger_lines(
        self, ledger: Ledger, checkpoint: Checkpoint, outcome: Outcome, *, vanished: bool
    ) -> list[str]:
        """The ledger entries ``outcome`` makes (noted in the ledger's memory); the report."""
        key = self.eval_key
        settlement = policy.settle(
            outcome.ok, outcome.reason, vanished=vanished,
            attempts=ledger.history(checkpoint.name, checkpoint.fingerprint, key).attempts,
            max_attempts=self.max_attempts, error=error_of(outcome),
        )
        if settlement.report is not None:
            getattr(self.report, settlement.report).append(checkpoint.step)
        if settlement.given_up is not None:
            log.warning("%r %s; not retried", checkpoint.name, settlement.given_up)
        return [
            ledger.note(checkpoint.name, checkpoint.fingerprint, checkpoint.step, key, status,
                        **fields)
            for status, fields in settlement.entries
        ]

    def _write(self, ledger: Ledger, lines: list[str], outcome: WatchedOutcome) -> None:
        """Blocking: the ledger first (what a restart resumes from), then the row."""
        ledger.write(lines)
        self.metrics.record(outcome)

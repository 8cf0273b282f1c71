"""The watch loop: complete checkpoints under a directory, evaluated once each, in step order.

The loop scans, asks the ledger which checkpoints are still due under this eval key, and
submits them to an :class:`~actorsys.EvalSupervisor` as ``checkpoint_dir=`` sources (never
deleted), one eval per fleet at a time, several fleets in parallel. Outcomes may settle out
of order across fleets; they are written to the ledger and to ``metrics.jsonl`` in the order
the checkpoints were submitted (step order), so the ledger's "done" only ever grows in step
order. A supervisor accepts a step once, so a retry (or a second directory of the same step)
waits for the next *generation*: a fresh supervisor on the same fleets, opened once the
current one has nothing in flight.
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
from typing import Any, Literal

import trio

from actorsys._errors import SupervisorClosedError
from actorsys.config import EvalConfig
from actorsys.fleet.engine import Fleet
from actorsys.outcome import Outcome
from actorsys.sinks import Sink
from actorsys.sinks_fanout import CallbackSink
from actorsys.supervisor import EvalSupervisor
from actorsys.watch.ledger import DONE, FAILED, SKIPPED, VANISHED, Ledger
from actorsys.watch.scan import Checkpoint, scan

log = logging.getLogger("actorsys.watch")

Catchup = Literal["all", "latest"]
FleetsFor = Callable[[Checkpoint], AbstractAsyncContextManager[Sequence[Fleet]]]
CLOSED = "closed"


@dataclass(frozen=True)
class WatchSettings:
    root: str
    out: str
    catchup: Catchup = "all"
    once: bool = False
    poll_interval: float = 10.0
    quiet_seconds: float | None = None
    max_attempts: int = 3
    eval_timeout: float | None = None
    pin_timeout: float = 600.0
    close_timeout: float = 30.0


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
    :meth:`interrupt`; cancelling ``run`` closes the supervisor within ``close_timeout``."""

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
        os.makedirs(settings.out, exist_ok=True)
        self.ledger = Ledger(os.path.join(settings.out, "ledger.jsonl"))
        self.metrics_path = os.path.join(settings.out, "metrics.jsonl")
        self.report = WatchReport()
        self.started: dict[int, float] = {}
        self._ignored: set[str] = set()
        self._order: list[Checkpoint] = []
        self._settled: dict[int, Outcome] = {}
        self._changed = trio.Event()
        self._supervisor: EvalSupervisor | None = None
        self._cancel = trio.CancelScope()

    async def run(self) -> WatchReport:
        with self._cancel:
            due = await self._first_due()
            if due:
                async with self.fleets_for(due[0]) as fleets:
                    while await self._generation(list(fleets)):
                        pass
        return self.report

    async def interrupt(self) -> None:
        """Cut off the points in flight (they settle ``closed``: not attempts, due again at
        the next start) and stop ``run``. Returns within ``close_timeout``."""
        self.report.interrupted = True
        if self._supervisor is not None:
            await self._supervisor.aclose(drain=False)
        self._cancel.cancel()

    # -- scanning ----------------------------------------------------------------------

    async def _due(self) -> list[Checkpoint]:
        found = await trio.to_thread.run_sync(self._scan)
        claimed = {c.name for c in self._order}
        return [
            c for c in found
            if c.name not in self._ignored and c.name not in claimed
            and self.ledger.due(c.name, self.eval_key, self.settings.max_attempts)
        ]

    def _scan(self) -> list[Checkpoint]:
        return scan(self.settings.root, quiet_seconds=self.settings.quiet_seconds, now=time.time())

    async def _first_due(self) -> list[Checkpoint]:
        while True:
            found = await trio.to_thread.run_sync(self._scan)
            if self.settings.catchup == "latest" and found:
                newest = found[-1].step
                self._ignored = {c.name for c in found if c.step < newest}
                if self._ignored:
                    log.info("--catchup latest: leaving %d older checkpoints", len(self._ignored))
            due = await self._due()
            if due or self.settings.once:
                return due
            await trio.sleep(self.settings.poll_interval)

    # -- one supervisor ----------------------------------------------------------------

    def _config(self, fleets: int) -> EvalConfig:
        return EvalConfig(
            max_in_flight=fleets + 1,
            keep_snapshots=0,
            eval_timeout=self.settings.eval_timeout,
            pin_timeout=self.settings.pin_timeout,
            close_timeout=self.settings.close_timeout,
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
        self._settled[outcome.step] = outcome
        while self._order and self._order[0].step in self._settled:
            checkpoint = self._order.pop(0)
            self._record(checkpoint, self._settled.pop(checkpoint.step))
        self._changed.set()

    def _record(self, checkpoint: Checkpoint, outcome: Outcome) -> None:
        ledger, key = self.ledger, self.eval_key
        attempt = ledger.history(checkpoint.name, key).attempts + 1
        if outcome.ok:
            ledger.append(checkpoint.name, checkpoint.step, key, DONE)
            self.report.ok.append(checkpoint.step)
        elif outcome.reason == CLOSED:
            pass
        elif not os.path.isdir(checkpoint.path):
            ledger.append(checkpoint.name, checkpoint.step, key, VANISHED, reason=outcome.reason)
            self.report.vanished.append(checkpoint.step)
        else:
            ledger.append(checkpoint.name, checkpoint.step, key, SKIPPED, reason=outcome.reason)
            if ledger.history(checkpoint.name, key).attempts >= self.settings.max_attempts:
                ledger.append(checkpoint.name, checkpoint.step, key, FAILED, reason=outcome.reason)
                self.report.failed.append(checkpoint.step)
                log.warning("%s failed %d times (%s); not retried", checkpoint.name, attempt,
                            outcome.reason)
        self._write_metrics(checkpoint, outcome, attempt)
        if self.sink is not None:
            self.sink.record(outcome)

    def _write_metrics(self, checkpoint: Checkpoint, outcome: Outcome, attempt: int | None) -> None:
        row = {**dataclasses.asdict(outcome), "checkpoint": checkpoint.name, "attempt": attempt,
               "eval_key": self.eval_key}
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row, default=repr) + "\n")


def eval_key(datasets: Sequence[Any]) -> str:
    """A short hash of the eval settings: every dataset's fingerprint (records and sampling
    settings), so a new dataset or a changed setting makes every checkpoint due again."""
    payload = json.dumps(sorted(dataset.fingerprint() for dataset in datasets)).encode()
    return hashlib.sha256(payload).hexdigest()[:16]

"""The watch loop: complete checkpoints under a directory, evaluated once each, in step order.

The loop scans, asks the ledger which checkpoints are still due under this eval key, and
submits them to an :class:`~actorsys.EvalSupervisor` as ``checkpoint_dir=`` sources (never
deleted), one eval per fleet at a time, several fleets in parallel. Outcomes may settle out
of order across fleets; they are written to the ledger and to ``metrics.jsonl`` in the order
the checkpoints were submitted (step order), so the ledger's "done" only ever grows in step
order (:mod:`~actorsys.watch.recorder`). A supervisor accepts a step once, so a retry (or a
second directory of the same step) waits for the next *generation*: a fresh supervisor on the
same fleets, opened once the current one has nothing in flight.

Every file operation (scans, ledger, metrics, the lock) runs in a worker thread; a scan or a
write stuck on a hung filesystem is abandoned when the watcher is cancelled or interrupted,
so it can never hold Ctrl-C past the close budget.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any, TypeVar

import trio

from actorsys._errors import SupervisorClosedError
from actorsys.config import EvalConfig
from actorsys.fleet.fleet import Fleet
from actorsys.outcome import Outcome
from actorsys.runtime import ThreadTracker, run_blocking
from actorsys.sinks import JsonlSink, Sink
from actorsys.sinks.fanout import CallbackSink, FanoutSink
from actorsys.supervisor import EvalSupervisor
from actorsys.watch import policy
from actorsys.watch.ledger import Ledger
from actorsys.watch.lock import OutLock
from actorsys.watch.policy import error_of
from actorsys.watch.recorder import Recorder
from actorsys.watch.scan import Checkpoint, Completion, Scanner
from actorsys.watch.settings import (
    WATCH_OWNED_FIELDS,
    WatchedOutcome,
    WatchReport,
    WatchSettings,
    eval_key,
)

__all__ = [
    "WATCH_OWNED_FIELDS",
    "WatchReport",
    "WatchSettings",
    "WatchedOutcome",
    "Watcher",
    "error_of",
    "eval_key",
]

log = logging.getLogger("actorsys.watch")

T = TypeVar("T")
FleetsFor = Callable[[Checkpoint], AbstractAsyncContextManager[Sequence[Fleet]]]


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
        self._changed = trio.Event()
        self.recorder = Recorder(
            eval_key=eval_key, max_attempts=settings.max_attempts, ledger=lambda: self.ledger,
            metrics=self.metrics, sink=self._sink, report=self.report, on_recorded=self._wake,
            limiter=self._out_limiter, threads=self.threads,
        )
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
                    nursery.start_soon(self.recorder.run)
                    due = await self._first_due()
                    if due:
                        async with self.fleets_for(due[0]) as fleets:
                            while await self._generation(list(fleets)):
                                pass
                    nursery.cancel_scope.cancel()
        finally:
            await self._close()
        return self.report

    async def interrupt(self) -> None:
        """Cut off the points in flight (they settle ``closed``: not attempts, due again at
        the next start), record what settled, and stop ``run``. Returns within
        ``close_timeout``."""
        self.report.interrupted = True
        with trio.move_on_after(self.settings.config.close_timeout):
            if self._supervisor is not None:
                await self._supervisor.aclose(drain=False)
            await self.recorder.drained()
        self._cancel.cancel()

    def _open(self) -> None:
        os.makedirs(self.settings.out, exist_ok=True)
        self.lock.acquire()
        if self._closed:  # run was cancelled and left this thread behind
            self.lock.release()
            return
        self._ledger = Ledger(os.path.join(self.settings.out, "ledger.jsonl"))

    async def _close(self) -> None:
        """Close the files ``run`` opened, also when ``run`` was cancelled. ``metrics.jsonl``
        in a worker thread, waited for ``close_timeout`` at most (its writer thread is a
        daemon: a hung disk holds up nothing); the lock on the trio thread, so that it is
        surely let go when ``run`` returns: closing it writes nothing (its pid was synced at
        acquire)."""
        self._closed = True
        try:
            with trio.CancelScope(shield=True), trio.move_on_after(
                self.settings.config.close_timeout
            ):
                await self._in_thread(self._out_limiter, self.metrics.close,
                                      "close metrics.jsonl")
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
        ledger, key, attempts = self.ledger, self.eval_key, self.settings.max_attempts
        return policy.due(
            found, ignored=self._ignored, claimed=self.recorder.claimed,
            unsettled=lambda c: ledger.due(c.name, c.fingerprint, key, attempts),
        )

    async def _first_due(self) -> list[Checkpoint]:
        while True:
            found = await self._scan()
            if found:
                self._ignored = policy.left_behind(found, self.settings.catchup)
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
                take, waiting = policy.this_generation(await self._due(), submitted)
                for checkpoint in take:
                    submitted.add(checkpoint.step)
                    self.recorder.claim(checkpoint)
                    self.started[checkpoint.step] = time.time()
                    log.info("evaluating %r (step %d)", checkpoint.name, checkpoint.step)
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
                then = policy.after_submitting(
                    in_flight=bool(self.recorder.order), waiting=waiting, once=self.settings.once
                )
                if then != "poll":
                    return then == "next_generation"
                with trio.move_on_after(self.settings.poll_interval):
                    await self._changed.wait()
                self._changed = trio.Event()

    # -- settling, in step order ---------------------------------------------------------

    def settled(self, outcome: Outcome) -> None:
        """An outcome from the supervisor's sink call, on whichever thread makes it; never
        blocks. The recorder records it once every checkpoint submitted before it is."""
        if self._token is None:
            raise RuntimeError("outcomes are handed over only while run() runs")
        self._token.run_sync_soon(self.recorder.take, outcome)

    def _wake(self) -> None:
        self._changed.set()

"""The requests a bridge makes of its supervisor, each answered through a
:class:`~bridge._calls.Call`.

A host call posts its request (never blocking) and waits on the answer for its own budget
only. When the answer does not come in time, the bridge answers from the host's own record
instead: a reserve that came too late is released by the trio side, a drain or a close is
reported from the steps handed over and the steps the sink saw settle.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from actorsys import ConfigError, SupervisorClosedError
from actorsys.config import EvalConfig, require_seconds
from actorsys.outcome import CloseReport, DrainReport, SupervisorStatistics
from actorsys.sinks import Sink
from actorsys.sinks.fanout import as_sink
from actorsys.snapshot import CapturedWeights, PoolStatistics
from actorsys.supervisor import Reservation, SubmitRequest, is_collective_job
from bridge._budgets import trio_share
from bridge._calls import Call, answer
from bridge._thread import Command, TrioThread
from bridge._weights import copy_weights

log = logging.getLogger("actorsys.bridge")

TRIO_THREAD = "actorsys bridge (trio thread)"
"""How the bridge's own thread is named in ``CloseReport.stuck_threads`` when it outlives close."""


class Runtime:
    """What the sync and asyncio bridges share: everything but how they wait."""

    def __init__(
        self,
        config: EvalConfig,
        *,
        eval_fn: Any,
        fleet: Any,
        sink: Sink | Sequence[Sink] | None,
        handoff_timeout: float,
    ) -> None:
        if not isinstance(config, EvalConfig):
            raise ConfigError("config", f"expected an EvalConfig, got {type(config).__name__}")
        require_seconds("handoff_timeout", handoff_timeout, allow_zero=True)
        self.config = config
        self.sink: Sink = as_sink(sink)
        self.handoff_timeout = float(handoff_timeout)
        self.trio = TrioThread(
            config, eval_fn=eval_fn, fleet=fleet, sink=self.sink, description=TRIO_THREAD,
            stop_at_exit=self.close_at_exit,
        )
        self.close_report: CloseReport | None = None
        self._lock = threading.Lock()
        self._close_call: Call[CloseReport] | None = None
        self._close_budget = 0.0
        self._close_drain = True

    def statistics(self) -> SupervisorStatistics:
        return self.trio.statistics()

    # -- submit ------------------------------------------------------------------------

    def reserve_bound(self, timeout: float | None, force: bool) -> float | None:
        """How long a submit may wait for its reservation: ``timeout`` if given; a ``skip``
        submit never waits for a slot, so it waits only ``handoff_timeout`` for an answer."""
        require_seconds("timeout", timeout, optional=True, allow_zero=True)
        if timeout is not None:
            return timeout
        if self.config.overflow == "skip" and not force and not is_collective_job():
            # A collective submit waits for the evaluating rank's answer (bounded there).
            return self.handoff_timeout
        return None

    def post_reserve(self, request: SubmitRequest) -> Call[Reservation | None]:
        """Ask for a slot for ``request``. Raises :class:`SupervisorClosedError` after close."""
        if self._close_call is not None or not self.trio.running:
            raise self.closed_error()
        call: Call[Reservation | None] = Call(f"submit(step={request.step!r})")

        def run(nursery: trio.Nursery) -> None:
            nursery.start_soon(self._reserve, call, request)

        def refuse() -> None:
            call.fail(self.closed_error())

        self.trio.post(Command(run, refuse))
        return call

    def take_reservation(
        self, call: Call[Reservation | None], bound: float | None
    ) -> Reservation | None:
        """The answer to a reserve whose wait ended (answered, timed out, or the thread ended).

        An answer that comes too late is left to the trio side, which releases it.
        """
        future = call.abandon()
        if future is not None:
            return answer(future)
        if self.trio.finished.done():
            raise self.closed_error()
        log.warning("%s: no slot within %s s; not admitted", call.description, bound)
        return None

    def copy_and_launch(
        self, call: Call[Reservation | None], bound: float | None, weights_source: Any
    ) -> bool:
        """Finish a submit whose wait for a reservation ended: copy the weights in the calling
        (host) thread into the reservation's buffers, then hand the point over. False if it
        was not admitted."""
        reservation = self.take_reservation(call, bound)
        if reservation is None:
            return False
        try:
            copies = weights_source is not None and reservation.buffers is not None
            weights = copy_weights(reservation, weights_source) if copies else None
        except BaseException:
            self.release(reservation)
            raise
        self.launch(reservation, weights)
        return True

    def give_up(self, call: Call[Reservation | None]) -> None:
        """The host stopped waiting for a reserve (an interrupt): release what it got."""
        future = call.abandon()
        if future is not None and future.exception() is None:
            reservation = future.result()
            if reservation is not None:
                self.release(reservation)

    def launch(self, reservation: Reservation, weights: CapturedWeights | None) -> None:
        self.trio.note_launched(reservation.point.step, borrowed=reservation.point.borrowed)
        self.trio.post(Command(lambda nursery: self._sup_launch(reservation, weights)), detached=True)

    def release(self, reservation: Reservation) -> None:
        self.trio.post(Command(lambda nursery: self.trio.supervisor.release(reservation)))

    def note_step(self, step: int) -> None:
        self.trio.post(Command(lambda nursery: self.trio.supervisor.note_step(step)))

    # -- prepare -----------------------------------------------------------------------

    def post_prepare(self, sources: Mapping[str, Any]) -> Call[PoolStatistics]:
        """Ask the supervisor to prepare for ``sources`` (``model`` / ``state_dict``)."""
        if self._close_call is not None or not self.trio.running:
            raise self.closed_error()
        call: Call[PoolStatistics] = Call("prepare")

        def run(nursery: trio.Nursery) -> None:
            nursery.start_soon(self._prepare, call, dict(sources))

        def refuse() -> None:
            call.fail(self.closed_error())

        self.trio.post(Command(run, refuse))
        return call

    def take_prepared(self, call: Call[PoolStatistics]) -> PoolStatistics | None:
        """The answer to a prepare whose wait ended; None if it ran out of time (the
        preparation goes on in the background)."""
        future = call.abandon()
        if future is not None:
            return answer(future)
        if self.trio.finished.done():
            raise self.closed_error()
        return None

    # -- drain and close ---------------------------------------------------------------

    def post_drain(self, timeout: float | None) -> Call[DrainReport]:
        require_seconds("timeout", timeout, optional=True, allow_zero=True)
        call: Call[DrainReport] = Call("drain")
        budget = None if timeout is None else trio_share(timeout)
        self.trio.post(Command(lambda nursery: nursery.start_soon(self._drain, call, budget)))
        return call

    def drain_report(self, call: Call[DrainReport], waiting: list[int]) -> DrainReport:
        """The trio side's report if it answered in time, else the host's view of ``waiting``."""
        future = call.abandon()
        if future is not None:
            return answer(future)
        settled = self.trio.settled(waiting)
        return DrainReport(settled=settled, pending=[s for s in waiting if s not in settled])

    def close_budget(self, timeout: float | None) -> float:
        require_seconds("timeout", timeout, optional=True, allow_zero=True)
        return self.config.close_timeout if timeout is None else float(timeout)

    def request_close(self, budget: float, drain: bool) -> Call[CloseReport]:
        """Ask the trio side to close within ``budget`` seconds; idempotent (the first request
        decides the budget and whether points in flight may finish first)."""
        with self._lock:
            if self._close_call is not None:
                return self._close_call
            call = self._close_call = Call("close")
            self._close_budget = trio_share(budget)
            self._close_drain = drain
        if self.trio.ever_started:
            self.trio.post(Command(lambda nursery: nursery.start_soon(self._close, call, nursery)))
        else:
            call.deliver(CloseReport(clean=True, abandoned=[], stuck_threads=[]))
        return call

    def close_at_exit(self) -> None:
        """At the interpreter's exit (from its thread, never blocking): a close with no budget
        and no drain, unless a close was asked for already (it then goes on)."""
        self.request_close(0.0, drain=False)

    def finish_close(self) -> CloseReport:
        """The report of a close whose waiting is over: the trio side's, plus the trio thread
        itself if it is still running; or, if it never answered, the host's own view."""
        call = self._close_call
        assert call is not None
        running = self.trio.running
        future = call.abandon()
        if future is not None and future.exception() is None:
            report = future.result()
            if running:
                report = CloseReport(
                    clean=False,
                    abandoned=report.abandoned,
                    stuck_threads=[*report.stuck_threads, TRIO_THREAD],
                )
        else:
            abandoned = self.trio.unsettled()
            stuck = [TRIO_THREAD] if running else []
            report = CloseReport(
                clean=not abandoned and not stuck, abandoned=abandoned, stuck_threads=stuck
            )
        with self._lock:
            if self.close_report is None:
                self.close_report = report
                if not report.clean:
                    log.warning(
                        "closed with steps %s abandoned, threads still running: %s",
                        report.abandoned, report.stuck_threads,
                    )
            return self.close_report

    def closed_error(self) -> SupervisorClosedError:
        if self.trio.crash is not None:
            error = SupervisorClosedError("the supervisor thread stopped; it admits nothing more")
            error.__cause__ = self.trio.crash
            return error
        if not self.trio.ever_started:
            return SupervisorClosedError("the bridge is not running; enter it with `with`")
        return SupervisorClosedError("the bridge is closed; it admits nothing more")

    # -- in the trio thread ------------------------------------------------------------

    def _sup_launch(self, reservation: Reservation, weights: CapturedWeights | None) -> None:
        self.trio.supervisor.launch(reservation, weights)

    async def _reserve(self, call: Call[Reservation | None], request: SubmitRequest) -> None:
        sup = self.trio.supervisor
        with trio.CancelScope() as scope:
            call.on_abandon(lambda: self.trio.post(Command(lambda nursery: scope.cancel())))
            try:
                reservation = await sup.reserve(request)
            except Exception as exc:
                call.fail(exc)
                return
        if scope.cancelled_caught:
            return
        if not call.deliver(reservation) and reservation is not None:
            sup.release(reservation)
        self.trio.publish()

    async def _prepare(self, call: Call[PoolStatistics], sources: dict[str, Any]) -> None:
        with trio.CancelScope() as scope:
            call.on_abandon(lambda: self.trio.post(Command(lambda nursery: scope.cancel())))
            try:
                statistics = await self.trio.supervisor.prepare(**sources)
            except Exception as exc:
                call.fail(exc)
                return
        if not scope.cancelled_caught:
            call.deliver(statistics)

    async def _drain(self, call: Call[DrainReport], budget: float | None) -> None:
        call.deliver(await self.trio.supervisor.drain(budget))

    async def _close(self, call: Call[CloseReport], nursery: trio.Nursery) -> None:
        report = await self.trio.supervisor.aclose(self._close_budget, drain=self._close_drain)
        self.trio.publish()
        call.deliver(report)
        nursery.cancel_scope.cancel()

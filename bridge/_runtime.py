"""The bridge's runtime: one EvalSupervisor on trio, in a daemon thread the bridge starts.

The host never calls into trio directly. A request is *posted* (``TrioToken.run_sync_soon``
onto an unbounded memory channel; neither ever blocks) and its answer comes back in a
:class:`~bridge._calls.Call`, so a host call waits only as long as its own budget however stuck
the trio thread is. What the trio thread never answered is rebuilt from the host's own record:
the steps it handed over, and the steps the sink saw settle.

In the trio thread one dispatcher task takes requests in the order they were posted: quick ones
(launch, release, note_step) run inline, so they keep that order; waiting ones (reserve, drain,
close) get a task each.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from actorsys import snapshot
from actorsys._errors import ConfigError, SupervisorClosedError
from actorsys.config import EvalConfig
from actorsys.fleet import Fleet
from actorsys.outcome import CloseReport, DrainReport, Outcome, SupervisorStatistics
from actorsys.sinks import MemorySink, Sink
from actorsys.supervisor import EvalSupervisor, Reservation
from bridge._calls import Call, answer

log = logging.getLogger("actorsys.bridge")

TRIO_THREAD = "actorsys bridge (trio thread)"
"""How the bridge's own thread is named in ``CloseReport.stuck_threads`` when it outlives close."""

MARGIN_FRACTION = 0.05
MARGIN_MAX = 0.25


def trio_share(budget: float) -> float:
    """The part of a host budget the trio side may spend; the rest carries the answer back."""
    return max(0.0, budget - min(budget * MARGIN_FRACTION, MARGIN_MAX))


def copy_weights(reservation: Reservation, source: Any) -> snapshot.CapturedWeights:
    """Copy the weights of a reserved point, in the calling (host) thread.

    The one place the bridge copies weights. Blocks the caller for the copy; afterwards the
    caller may change its weights freely.
    """
    del reservation
    return snapshot.capture(source)


def drains_on_exit(exc: BaseException | None) -> bool:
    """Whether leaving a bridge's block lets the points in flight finish first: yes on a
    normal exit or an error; no when the host is being stopped (KeyboardInterrupt,
    SystemExit, task cancellation), which cuts them off at once."""
    return exc is None or isinstance(exc, Exception)


def check_seconds(name: str, value: object, *, optional: bool) -> None:
    """Raise :class:`ConfigError` unless ``value`` is a finite number of seconds >= 0."""
    if value is None and optional:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        allowed = "a number of seconds >= 0" + (" or None" if optional else "")
        raise ConfigError(name, f"expected {allowed}, got {value!r}")


@dataclass(frozen=True)
class _Command:
    run: Callable[[trio.Nursery], None]
    """Runs in the dispatcher task; starts a task in the nursery for anything that waits."""
    refuse: Callable[[], None]
    """Runs instead when the trio side is gone; never raises."""


def _nothing() -> None:
    return None


class _Recorder:
    """The sink the supervisor sees: the host's sink, then the bridge's own record."""

    def __init__(self, sink: Sink, settled: Callable[[Outcome], None]) -> None:
        self._sink = sink
        self._settled = settled

    def record(self, outcome: Outcome) -> None:
        try:
            self._sink.record(outcome)
        finally:
            self._settled(outcome)


class Runtime:
    """The trio thread, the posting of requests, and the host's record of handed-over steps."""

    def __init__(
        self,
        config: EvalConfig,
        *,
        eval_fn: Any,
        fleet: Fleet | Any,
        sink: Sink | None,
        handoff_timeout: float,
    ) -> None:
        if not isinstance(config, EvalConfig):
            raise ConfigError("config", f"expected an EvalConfig, got {type(config).__name__}")
        check_seconds("handoff_timeout", handoff_timeout, optional=False)
        self.config = config
        self.sink: Sink = sink if sink is not None else MemorySink()
        self.handoff_timeout = float(handoff_timeout)
        self.started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.finished: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.thread = threading.Thread(target=self._run, name="actorsys-bridge", daemon=True)
        self.close_report: CloseReport | None = None
        self._eval_fn = eval_fn
        self._fleet = fleet
        self._lock = threading.Lock()
        self._token: trio.lowlevel.TrioToken | None = None
        self._inbox: trio.MemorySendChannel[_Command] | None = None
        self._sup: EvalSupervisor | None = None
        self._close_call: Call[CloseReport] | None = None
        self._close_budget = 0.0
        self._close_drain = True
        self._launched: set[int] = set()
        self._settled: set[int] = set()
        self._stats = SupervisorStatistics(
            in_flight=0, settled=0, ok=0, skipped_by_reason={}, restarts=0,
            gave_up=False, closed=False,
        )
        self._crash: BaseException | None = None

    # -- the host side -------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    @property
    def closing(self) -> bool:
        return self._close_call is not None

    def statistics(self) -> SupervisorStatistics:
        """The supervisor's statistics as last published by the trio thread (never blocks)."""
        return self._stats

    def unsettled(self) -> list[int]:
        """Steps handed over to the pipeline that the sink has not seen settle."""
        with self._lock:
            return sorted(self._launched - self._settled)

    def settled(self, steps: list[int]) -> list[int]:
        with self._lock:
            return [step for step in steps if step in self._settled]

    def reserve_bound(self, timeout: float | None, force: bool) -> float | None:
        """How long a submit may wait for its reservation: ``timeout`` if given; a ``skip``
        submit never waits for a slot, so it waits only ``handoff_timeout`` for an answer."""
        check_seconds("timeout", timeout, optional=True)
        if timeout is not None:
            return timeout
        if self.config.overflow == "skip" and not force:
            return self.handoff_timeout
        return None

    def post_reserve(
        self, step: int, sources: Mapping[str, Any], force: bool
    ) -> Call[Reservation | None]:
        """Ask for a slot for ``step``. Raises :class:`SupervisorClosedError` after close."""
        if self.closing or self.finished.done():
            raise self.closed_error()
        call: Call[Reservation | None] = Call(f"submit(step={step!r})")

        def run(nursery: trio.Nursery) -> None:
            nursery.start_soon(self._reserve, call, step, dict(sources), force)

        def refuse() -> None:
            call.fail(self.closed_error())

        self._post(_Command(run, refuse))
        return call

    def take_reservation(
        self, call: Call[Reservation | None], bound: float | None
    ) -> Reservation | None:
        """The answer to a reserve whose wait ended (answered, timed out, or the thread ended).

        An answer that came too late is left to the trio side, which releases it.
        """
        future = call.abandon()
        if future is not None:
            return answer(future)
        if self.finished.done():
            raise self.closed_error()
        log.warning("%s: no slot within %s s; not admitted", call.description, bound)
        return None

    def give_up(self, call: Call[Reservation | None]) -> None:
        """The host stopped waiting for a reserve (an interrupt): release what it got."""
        future = call.abandon()
        if future is not None and future.exception() is None:
            reservation = future.result()
            if reservation is not None:
                self.release(reservation)

    def launch(self, reservation: Reservation, weights: snapshot.CapturedWeights | None) -> None:
        step = reservation.point.step
        with self._lock:
            self._launched.add(step)

        def run(nursery: trio.Nursery) -> None:
            assert self._sup is not None
            self._sup.launch(reservation, weights)

        self._post(_Command(run, _nothing))

    def release(self, reservation: Reservation) -> None:
        def run(nursery: trio.Nursery) -> None:
            assert self._sup is not None
            self._sup.release(reservation)

        self._post(_Command(run, _nothing))

    def note_step(self, step: int) -> None:
        def run(nursery: trio.Nursery) -> None:
            assert self._sup is not None
            self._sup.note_step(step)

        self._post(_Command(run, _nothing))

    def post_drain(self, timeout: float | None) -> Call[DrainReport]:
        check_seconds("timeout", timeout, optional=True)
        call: Call[DrainReport] = Call("drain")
        budget = None if timeout is None else trio_share(timeout)

        def run(nursery: trio.Nursery) -> None:
            nursery.start_soon(self._drain, call, budget)

        self._post(_Command(run, _nothing))
        return call

    def drain_report(self, call: Call[DrainReport], waiting: list[int]) -> DrainReport:
        """The trio side's report if it answered in time, else the host's view of ``waiting``."""
        future = call.abandon()
        if future is not None:
            return answer(future)
        settled = self.settled(waiting)
        return DrainReport(settled=settled, pending=[s for s in waiting if s not in settled])

    def close_budget(self, timeout: float | None) -> float:
        check_seconds("timeout", timeout, optional=True)
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
            started = self._token is not None
        if started:
            self._post(_Command(lambda nursery: nursery.start_soon(self._close, nursery), _nothing))
        elif self.thread.ident is None or self.finished.done():
            call.deliver(CloseReport(clean=True, abandoned=[], stuck_threads=[]))
        return call

    def finish_close(self) -> CloseReport:
        """The report of a close whose waiting is over: the trio side's, plus the trio thread
        itself if it is still running; or, if it never answered, the host's own view."""
        call = self._close_call
        assert call is not None
        alive = self.thread.ident is not None and not self.finished.done()
        future = call.abandon()
        if future is not None and future.exception() is None:
            report = future.result()
            if alive:
                report = CloseReport(
                    clean=False,
                    abandoned=report.abandoned,
                    stuck_threads=[*report.stuck_threads, TRIO_THREAD],
                )
        else:
            abandoned = self.unsettled()
            stuck = [TRIO_THREAD] if alive else []
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
        if self._crash is not None:
            error = SupervisorClosedError("the supervisor thread stopped; it admits nothing more")
            error.__cause__ = self._crash
            return error
        return SupervisorClosedError("the bridge is closed; it admits nothing more")

    def _post(self, command: _Command) -> None:
        with self._lock:
            token = self._token
        if token is None:
            command.refuse()
            return
        try:
            token.run_sync_soon(self._enqueue, command)
        except trio.RunFinishedError:
            command.refuse()

    # -- the trio side -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            if not self.started.done():
                self.started.set_exception(exc)
            else:
                self._crash = exc
                log.error("the supervisor thread stopped", exc_info=exc)
        finally:
            self.finished.set_result(None)

    async def _main(self) -> None:
        inbox_send, inbox_recv = trio.open_memory_channel[_Command](math.inf)
        recorder = _Recorder(self.sink, self._on_settled)
        async with EvalSupervisor.open(
            self.config, eval_fn=self._eval_fn, fleet=self._fleet, sink=recorder
        ) as sup:
            self._sup = sup
            self._publish()
            async with trio.open_nursery() as nursery:
                with self._lock:
                    self._inbox = inbox_send
                    self._token = trio.lowlevel.current_trio_token()
                    closing = self._close_call is not None
                self.started.set_result(None)
                nursery.start_soon(self._dispatch, inbox_recv, nursery)
                if closing:
                    nursery.start_soon(self._close, nursery)

    def _enqueue(self, command: _Command) -> None:
        assert self._inbox is not None
        try:
            self._inbox.send_nowait(command)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            command.refuse()

    async def _dispatch(
        self, inbox: trio.MemoryReceiveChannel[_Command], nursery: trio.Nursery
    ) -> None:
        try:
            async for command in inbox:
                try:
                    command.run(nursery)
                except Exception:
                    log.exception("a bridge request failed in the supervisor thread")
                self._publish()
        finally:
            while True:
                try:
                    inbox.receive_nowait().refuse()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            inbox.close()

    async def _reserve(
        self, call: Call[Reservation | None], step: int, sources: dict[str, Any], force: bool
    ) -> None:
        sup = self._sup
        assert sup is not None
        with trio.CancelScope() as scope:
            call.on_abandon(lambda: self._post(_Command(lambda nursery: scope.cancel(), _nothing)))
            try:
                reservation = await sup.reserve(step, force=force, **sources)
            except Exception as exc:
                call.fail(exc)
                return
        if scope.cancelled_caught:
            return
        if not call.deliver(reservation) and reservation is not None:
            sup.release(reservation)
        self._publish()

    async def _drain(self, call: Call[DrainReport], budget: float | None) -> None:
        assert self._sup is not None
        call.deliver(await self._sup.drain(budget))

    async def _close(self, nursery: trio.Nursery) -> None:
        sup, call = self._sup, self._close_call
        assert sup is not None
        assert call is not None
        report = await sup.aclose(self._close_budget, drain=self._close_drain)
        self._publish()
        call.deliver(report)
        nursery.cancel_scope.cancel()

    def _on_settled(self, outcome: Outcome) -> None:
        with self._lock:
            self._settled.add(outcome.step)
        self._publish()

    def _publish(self) -> None:
        if self._sup is not None:
            self._stats = self._sup.statistics()

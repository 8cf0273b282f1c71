"""The supervisor's own thread: one EvalSupervisor on trio, and the only way to reach it.

The host never calls into trio. It *posts* a :class:`Command` (``TrioToken.run_sync_soon``
onto an unbounded memory channel: neither ever blocks, whatever the trio thread is doing).
In the trio thread one dispatcher task runs the commands in the order they were posted; a
command that has to wait starts a task of its own, so the dispatcher never does.

A host thread that must not wait for the trio thread to be done with its command (the last
step of a submit, on the trainer's stall) posts it *detached*: a relay thread wakes the trio
thread instead. Waking it from the host's thread would hand the GIL to the trio thread for as
long as it then runs (up to the interpreter's switch interval) before the host's thread gets
it back. Commands reach the dispatcher in the order they were posted either way.

The thread also keeps the host's own record of the pipeline, readable without the trio
thread: the steps handed over, the steps the sink saw settle, and the supervisor's statistics
as last published.

While it runs, the thread is registered with :mod:`actorsys.runtime.exit_guard`: a host that
exits with the bridge still open, or right after a close whose answer it stopped waiting for,
has the interpreter's exit ask the supervisor to close (``stop_at_exit``) and wait for it
(within the guard's bound), so that no export or evaluation the close would still cut off or
clean up is left inside torch when the interpreter finalizes.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from actorsys.config import EvalConfig
from actorsys.outcome import BestPoint, Outcome, SupervisorStatistics
from actorsys.runtime import exit_guard
from actorsys.sinks import Sink
from actorsys.sinks.fanout import CallbackSink, FanoutSink
from actorsys.supervisor import EvalSupervisor

log = logging.getLogger("actorsys.bridge")

THREAD_NAME = "actorsys-bridge"
RELAY_NAME = f"{THREAD_NAME} (relay)"


def nothing() -> None:
    return None


@dataclass(frozen=True)
class Command:
    run: Callable[[trio.Nursery], None]
    """Runs in the dispatcher task; starts a task in the nursery for anything that waits."""
    refuse: Callable[[], None] = nothing
    """Runs instead if the trio side is gone or never came up; never raises."""


class TrioThread:
    """A daemon thread running ``EvalSupervisor.open(...)`` under ``trio.run``.

    ``started`` resolves once the supervisor is up (or to its start-up error); ``finished``
    once ``trio.run`` has returned. Commands posted before the thread is up wait for it.
    """

    def __init__(
        self,
        config: EvalConfig,
        *,
        eval_fn: Any,
        fleet: Any,
        sink: Sink,
        description: str,
        stop_at_exit: Callable[[], None],
    ) -> None:
        self.config = config
        self.description = description
        self._stop_at_exit = stop_at_exit
        self.sink = sink
        self.started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.finished: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.crash: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._eval_fn = eval_fn
        self._fleet = fleet
        self._lock = threading.Lock()
        self._token: trio.lowlevel.TrioToken | None = None
        self._inbox: trio.MemorySendChannel[Command] | None = None
        self._early: list[Command] = []
        self._ended = False
        self._sup: EvalSupervisor | None = None
        self._launched: set[int] = set()
        self._settled: set[int] = set()
        self._borrowed: set[int] = set()
        self._decided: tuple[list[BestPoint], frozenset[int], str | None] = ([], frozenset(), None)
        self._relay_lock = threading.Lock()
        self._relayed: list[Command] = []
        self._relay_wake = threading.Event()
        self._relay: threading.Thread | None = None
        self._relay_gone = False
        self._stats = SupervisorStatistics(
            in_flight=0, settled=0, ok=0, skipped_by_reason={}, restarts=0,
            gave_up=False, closed=False,
        )

    # -- the host side -------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def ever_started(self) -> bool:
        return self._thread.ident is not None

    @property
    def running(self) -> bool:
        """The thread was started and ``trio.run`` has not returned."""
        return self.ever_started and not self.finished.done()

    def join(self, timeout: float) -> None:
        """Block for at most ``timeout`` seconds until the thread has ended."""
        if self.ever_started:
            self._thread.join(timeout)

    def post(self, command: Command, *, detached: bool = False) -> None:
        """Hand ``command`` to the trio thread without blocking, or refuse it at once.

        ``detached``: the relay thread wakes the trio thread, so this returns without waiting
        for the GIL while the trio thread handles the command. A command posted while
        detached ones wait for the relay goes behind them."""
        with self._relay_lock:
            if (detached or self._relayed) and not self._relay_gone:
                self._relayed.append(command)
                if self._relay is None:
                    self._relay = threading.Thread(target=self._run_relay, name=RELAY_NAME, daemon=True)
                    self._relay.start()
                self._relay_wake.set()
                return
            self._post_now(command)

    def _post_now(self, command: Command) -> None:
        with self._lock:
            token = self._token
            if token is None and self.ever_started and not self._ended:
                self._early.append(command)
                return
        if token is None:
            command.refuse()
            return
        try:
            token.run_sync_soon(self._enqueue, command)
        except trio.RunFinishedError:
            command.refuse()

    def _run_relay(self) -> None:
        """Post what was posted detached, in order, until the trio thread has ended.

        Registered with the exit guard until it holds no command any more: a command may hold
        the last reference to a point's weights, and a tensor freed in a daemon thread once
        the interpreter finalizes aborts the process."""
        with exit_guard.guarded(RELAY_NAME):
            while self._relay_once():
                pass

    def _relay_once(self) -> bool:
        """Wait to be woken, post what waits; False once the trio thread has ended."""
        self._relay_wake.wait()
        with self._relay_lock:
            self._relay_wake.clear()
            relayed, self._relayed = self._relayed, []
            for command in relayed:
                self._post_now(command)
            if self.finished.done():
                self._relay_gone = True
                return False
            return True

    def note_launched(self, step: int, *, borrowed: bool = False) -> None:
        """``step`` is handed over; ``borrowed``: it evaluates a checkpoint of the trainer's."""
        with self._lock:
            self._launched.add(step)
            if borrowed:
                self._borrowed.add(step)

    def unsettled(self) -> list[int]:
        """Steps handed over to the pipeline that the sink has not seen settle."""
        with self._lock:
            return sorted(self._launched - self._settled)

    def settled(self, steps: list[int]) -> list[int]:
        """Those of ``steps`` the sink has seen settle."""
        with self._lock:
            return [step for step in steps if step in self._settled]

    def statistics(self) -> SupervisorStatistics:
        """The supervisor's statistics as last published by the trio thread (never blocks)."""
        return self._stats

    def decided(self) -> tuple[list[BestPoint], frozenset[int], str | None]:
        """The best points, the protected steps and the stop reason, as last published, with
        the trainer's checkpoints handed over and not yet seen settle (never blocks)."""
        best, protected, reason = self._decided
        with self._lock:
            borrowed = self._borrowed - self._settled
        return list(best), protected | borrowed, reason

    # -- the trio side -------------------------------------------------------------------

    @property
    def supervisor(self) -> EvalSupervisor:
        """The running supervisor; only for commands, which run in the trio thread."""
        assert self._sup is not None
        return self._sup

    def publish(self) -> None:
        if self._sup is not None:
            sup = self._sup
            self._stats = sup.statistics()
            self._decided = (sup.best(), sup.protected_steps(), sup.stop_reason)

    def _run(self) -> None:
        with exit_guard.guarded(self.description, stop=self._stop_at_exit):
            self._run_trio()

    def _run_trio(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            if not self.started.done():
                self.started.set_exception(exc)
            else:
                self.crash = exc
                log.error("the supervisor thread stopped", exc_info=exc)
        finally:
            with self._lock:
                self._ended = True
                early, self._early = self._early, []
            for command in early:
                command.refuse()
            self.finished.set_result(None)
            self._relay_wake.set()

    async def _main(self) -> None:
        inbox_send, inbox_recv = trio.open_memory_channel[Command](math.inf)
        # Published before the host's sink records, so a host that sees an outcome sees
        # what it decided (best, should_stop); marked settled after, as the sink's record.
        recorder = FanoutSink([
            CallbackSink(lambda outcome: self.publish()), self.sink, CallbackSink(self._on_settled)
        ])
        async with EvalSupervisor.open(
            self.config, eval_fn=self._eval_fn, fleet=self._fleet, sink=recorder
        ) as sup:
            self._sup = sup
            self.publish()
            async with trio.open_nursery() as nursery:
                with self._lock:
                    self._inbox = inbox_send
                    self._token = trio.lowlevel.current_trio_token()
                    early, self._early = self._early, []
                for command in early:
                    inbox_send.send_nowait(command)
                self.started.set_result(None)
                nursery.start_soon(self._dispatch, inbox_recv, nursery)

    def _enqueue(self, command: Command) -> None:
        assert self._inbox is not None
        try:
            self._inbox.send_nowait(command)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            command.refuse()

    async def _dispatch(
        self, inbox: trio.MemoryReceiveChannel[Command], nursery: trio.Nursery
    ) -> None:
        try:
            async for command in inbox:
                try:
                    command.run(nursery)
                except Exception:
                    log.exception("a bridge request failed in the supervisor thread")
                self.publish()
        finally:
            while True:
                try:
                    inbox.receive_nowait().refuse()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            inbox.close()

    def _on_settled(self, outcome: Outcome) -> None:
        with self._lock:
            self._settled.add(outcome.step)
        self.publish()

"""The actor kernel: long-lived trio tasks under one_for_one supervision.

An actor is an ``async`` callable that runs until its inbox closes. A :class:`ChildSpec` says
how it is restarted and how long it gets to stop. :class:`ActorSupervisor` restarts a crashed
child on its own (one_for_one), and gives up when more than ``max_restarts`` restarts fall
within ``restart_period`` seconds: then every child is cancelled and ``on_give_up`` is told.

Only ``Exception`` counts as a crash: ``trio.Cancelled`` and ``KeyboardInterrupt`` are never
caught, so cancellation and Ctrl-C keep their meaning. Time is read through
``trio.current_time()``, so a ``MockClock`` drives the restart window.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import trio


class Restart(enum.Enum):
    """When a child that ended is started again (OTP's restart types)."""

    PERMANENT = "permanent"
    """Always, unless the supervisor is shutting down."""
    TRANSIENT = "transient"
    """Only after a crash; a normal return is final."""
    TEMPORARY = "temporary"
    """Never."""


def _no_stop() -> None:
    return None


@dataclass(frozen=True)
class ChildSpec:
    """One supervised actor.

    ``run`` is called afresh on every (re)start. ``stop`` asks the actor to finish (typically:
    close the channel that feeds it); the actor then has ``shutdown`` seconds to return before
    it is cancelled.
    """

    name: str
    run: Callable[[], Awaitable[None]]
    restart: Restart = Restart.TRANSIENT
    shutdown: float = 5.0
    stop: Callable[[], None] = field(default=_no_stop)


class RestartIntensity:
    """At most ``max_restarts`` restarts within any ``period`` seconds."""

    def __init__(self, max_restarts: int, period: float) -> None:
        self.max_restarts = max_restarts
        self.period = period
        self._times: deque[float] = deque()

    def allow(self, now: float) -> bool:
        """Record a restart at ``now``; False if it would exceed the intensity."""
        while self._times and now - self._times[0] >= self.period:
            self._times.popleft()
        if len(self._times) >= self.max_restarts:
            return False
        self._times.append(now)
        return True


class ActorSupervisor:
    """Runs children one_for_one. Start it with ``nursery.start(sup.run)``.

    ``on_crash(name, exc)`` is called for every crash before any restart; ``on_give_up(exc)``
    once, when the intensity is exceeded (after which every child has been cancelled).
    """

    def __init__(
        self,
        specs: Sequence[ChildSpec],
        *,
        max_restarts: int,
        restart_period: float,
        on_crash: Callable[[str, Exception], None],
        on_give_up: Callable[[Exception], None],
    ) -> None:
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"child names must be unique, got {names}")
        self._specs = list(specs)
        self._intensity = RestartIntensity(max_restarts, restart_period)
        self._on_crash = on_crash
        self._on_give_up = on_give_up
        self._root = trio.CancelScope()
        self._scopes: dict[str, trio.CancelScope] = {}
        self._finished: dict[str, trio.Event] = {}
        self.restarts = 0
        self.stopping = False
        self.gave_up: Exception | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run every child until each has ended; never raises ``Exception`` out of a child."""
        with self._root:
            async with trio.open_nursery() as nursery:
                for spec in self._specs:
                    self._scopes[spec.name] = trio.CancelScope()
                    self._finished[spec.name] = trio.Event()
                    nursery.start_soon(self._supervise, spec, name=f"actor:{spec.name}")
                task_status.started()

    def cancel(self) -> None:
        """Cancel every child at once (the root scope)."""
        self.stopping = True
        self._root.cancel()

    async def shutdown(self) -> None:
        """Stop the children in order: ask each to stop, wait up to its ``shutdown`` budget,
        then cancel it. Blocks until every child has ended; the caller's scope bounds it."""
        self.stopping = True
        for spec in self._specs:
            spec.stop()
            with trio.move_on_after(spec.shutdown):
                await self._finished[spec.name].wait()
            self._scopes[spec.name].cancel()
            await self._finished[spec.name].wait()

    async def _supervise(self, spec: ChildSpec) -> None:
        try:
            with self._scopes[spec.name]:
                await self._run_child(spec)
        finally:
            self._finished[spec.name].set()

    async def _run_child(self, spec: ChildSpec) -> None:
        while True:
            crash: Exception | None = None
            try:
                await spec.run()
            except Exception as exc:
                crash = exc
                self._on_crash(spec.name, exc)
            if self.stopping or spec.restart is Restart.TEMPORARY:
                return
            if crash is None and spec.restart is Restart.TRANSIENT:
                return
            if not self._intensity.allow(trio.current_time()):
                self._give_up(crash or RuntimeError(f"actor {spec.name!r} kept returning"))
                return
            self.restarts += 1
            await trio.lowlevel.checkpoint()

    def _give_up(self, exc: Exception) -> None:
        if self.gave_up is None:
            self.gave_up = exc
            self.cancel()
            self._on_give_up(exc)

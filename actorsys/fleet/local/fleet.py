"""LocalFleet: N engines on loopback, optionally behind sglang-router, started and stopped here.

Example::

    async with LocalFleet.open([embedded(model_dir)] * 2, router=True) as local:
        async with EvalSupervisor.open(config, eval_fn=MyEval(), fleet=local.fleet) as sup:
            ...

Each engine gets a port and a log file, and is up once ``GET /health`` answers 200. The
fleet makes a random key (``api_key``), hands it to every engine through its environment and
gives it to their clients: an engine answers nothing but ``/health`` without it.
Every process runs under a reaper in its own process group (see ``_process``), so leaving the
block, a cancellation, or the owner's crash stops them all: SIGTERM, then SIGKILL after
``grace`` seconds.

No other local user can take an engine's port and with it the key (see ``_port``): the fleet
binds each engine's listening socket itself, on a port the kernel picks, and the engine serves
that socket (``EngineSpec.listen``); the fleet keeps its copy open until it closes, so the port
is never free, not even while the engine restarts (connections wait in the backlog). The
router, which binds its own ports (sglang-router serves no inherited socket), gets no request,
``/health`` included, before the socket that listens on its port is proven to be held by the
router's own processes; should it exit, its port is free again, so the fleet forgets it and
sends its requests to the engines directly.

Engines are supervised like the pipeline's actors: one that exits is started again on its
port (its client stays valid), at most ``max_restarts`` times within ``restart_period``
seconds; past that the fleet gives up on it, logs so, and leaves it down (its ``state`` is
``"gave_up"``; points pin ``unhealthy``). A restarted engine serves its initial weights: the
next pin loads the snapshot and reads the version back, as every pin does.

How one engine or the router is started and waited for: :mod:`~actorsys.fleet.local.start`.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import TypeVar

import trio

from actorsys._errors import ConfigError
from actorsys.fleet._proc.process import ManagedProcess
from actorsys.fleet._proc.serving import new_api_key
from actorsys.fleet.fleet import Fleet
from actorsys.fleet.local.engine import LocalEngine
from actorsys.fleet.local.specs import EngineSpec
from actorsys.fleet.local.start import log_directory, start_engine, start_router, wait_started
from actorsys.fleet.on_all import EngineUnauthorizedError, FleetStartError
from actorsys.runtime import RestartIntensity, ThreadTracker, run_blocking

__all__ = ["LocalFleet"]

log = logging.getLogger("actorsys.fleet")

T = TypeVar("T")


class LocalFleet:
    """Processes of one local fleet. ``fleet`` is the :class:`Fleet` of their clients.

    ``api_key``: the fleet's random key. Every engine gets it (through its environment) and
    answers only requests that carry it, but for ``/health``; the clients send it.
    """

    def __init__(
        self,
        log_dir: str,
        grace: float,
        startup_timeout: float,
        max_restarts: int = 3,
        restart_period: float = 60.0,
    ) -> None:
        self.log_dir = log_dir
        self.grace = grace
        self.startup_timeout = startup_timeout
        self.max_restarts = max_restarts
        self.restart_period = restart_period
        self.engines: list[LocalEngine] = []
        self._closing = False
        self._nursery: trio.Nursery | None = None
        self.router: ManagedProcess | None = None
        self.router_url: str | None = None
        self.api_key = new_api_key()
        self.fleet: Fleet
        self.threads = ThreadTracker()
        """File work of the fleet (its log directory) running in a worker thread."""
        self._files = trio.CapacityLimiter(1)

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        specs: Sequence[EngineSpec],
        *,
        router: bool = False,
        log_dir: str | None = None,
        grace: float = 5.0,
        startup_timeout: float = 120.0,
        max_restarts: int = 3,
        restart_period: float = 60.0,
    ) -> AsyncIterator[LocalFleet]:
        """Start one engine per spec (and the router), wait until all are healthy, yield.

        Raises :class:`FleetStartError` if one exits or is not healthy within
        ``startup_timeout`` seconds; whatever was started is stopped first. Logs go to
        ``log_dir`` (default: a temporary directory, removed afterwards). An engine that
        exits later is restarted, at most ``max_restarts`` times within ``restart_period``
        seconds (``max_restarts=0``: never).
        """
        if not specs:
            raise ConfigError("LocalFleet.open(specs)", "at least one engine spec is required")
        if not isinstance(max_restarts, int) or max_restarts < 0:
            raise ConfigError(
                "LocalFleet.open(max_restarts)", f"expected an integer >= 0, got {max_restarts!r}"
            )
        own_logs = log_dir is None
        local = cls(log_dir or "", grace, startup_timeout, max_restarts, restart_period)
        local.log_dir = await local._in_thread(partial(log_directory, log_dir),
                                               "make the fleet's log directory")
        try:
            for index, spec in enumerate(specs):
                local.engines.append(await start_engine(f"{spec.kind}-{index}", spec,
                                                  log_dir=local.log_dir, api_key=local.api_key,
                                                  grace=grace))
            for engine in local.engines:
                await local._wait_started(engine)
            if router:
                await local._start_router()
            local.fleet = Fleet([e.client for e in local.engines], router_url=local.router_url)
            async with trio.open_nursery() as nursery:
                local._nursery = nursery
                for engine in local.engines:
                    nursery.start_soon(local._supervise, engine)
                if local.router is not None:
                    nursery.start_soon(local._watch_router, local.router)
                try:
                    yield local
                finally:
                    local._closing = True
                    nursery.cancel_scope.cancel()
        finally:
            await local.aclose()
            if own_logs:
                with trio.CancelScope(shield=True), trio.move_on_after(max(grace, 1.0)):
                    await local._in_thread(
                        partial(shutil.rmtree, local.log_dir, ignore_errors=True),
                        f"remove {local.log_dir}",
                    )

    async def _in_thread(self, fn: Callable[[], T], description: str) -> T:
        """``fn()`` (a file operation) in a worker thread; abandoned, listed in ``threads``
        until it ends, when the caller is cancelled (a hung filesystem holds no Ctrl-C)."""
        return await run_blocking(fn, abandon_on_cancel=True, limiter=self._files,
                                  description=description, tracker=self.threads)

    @property
    def urls(self) -> list[str]:
        return [engine.url for engine in self.engines]

    async def _start_router(self) -> None:
        self.router, self.router_url = await start_router(self.urls, log_dir=self.log_dir,
                                                    grace=self.grace)
        await wait_started(self.router, self.router_url, startup_timeout=self.startup_timeout,
                           proven=False)

    async def restart(self, index: int, spec: EngineSpec | None = None) -> None:
        """Stop engine ``index`` (if it still runs) and start it again on the same port, with
        the same client (and ``spec``, if given, in place of its own); return once it is
        healthy. Its weights are the initial ones again. An engine the fleet gave up on is
        supervised again."""
        engine = self.engines[index]
        async with engine.lock:
            await engine.process.stop(self.grace)
            if engine.door is not None:
                engine.door.cancel()
                engine.door = None
            if spec is not None:
                engine.spec = spec
            await self._replace_process(engine)
            if engine.state == "gave_up" and self._nursery is not None:
                self._nursery.start_soon(self._supervise, engine)
            engine.set_state("running")

    async def _replace_process(self, engine: LocalEngine) -> None:
        if engine.listener is not None and engine.spec.listen is None:
            engine.listener.close()  # a spec that binds its own port replaced one that did not
            engine.listener = None
        started = await start_engine(engine.name, engine.spec, log_dir=self.log_dir,
                               api_key=self.api_key, grace=self.grace, port=engine.port,
                               listener=engine.listener)
        engine.process, engine.listener = started.process, started.listener
        await self._wait_started(engine)

    async def _wait_started(self, engine: LocalEngine) -> None:
        """Until ``engine`` is healthy (proven to hold its port unless it serves the socket
        the fleet holds for it)."""
        await wait_started(engine.process, engine.url, startup_timeout=self.startup_timeout,
                           proven=engine.listener is not None)

    async def _watch_router(self, router: ManagedProcess) -> None:
        """When the router exits, send the fleet's requests to the engines themselves: the
        router's port is free from then on, and another user could take it (sglang-router
        binds its own port and cannot serve a socket the fleet holds)."""
        status = await router.wait()
        if self._closing:
            return
        self.router_url = None
        self.fleet.router_url = None
        log.error("the router exited with status %s; the fleet's requests go to its engines "
                  "directly from now on (its port is not ours any more); log tail:\n%s",
                  status, await router.read_log_tail(1000))

    async def _supervise(self, engine: LocalEngine) -> None:
        """Restart ``engine`` whenever its process exits, within the restart intensity."""
        # Not actorsys.runtime's ActorSupervisor, whose rules fit actors, not engines: it keeps
        # one intensity for all its children and, past it, cancels them all and reports
        # through a synchronous callback. Here each engine has its own intensity; an engine
        # the fleet gives up on leaves the others serving, and its port is first set to
        # refuse connections (awaited, so no client queues in its backlog meanwhile); a
        # restart the user asked for (restart(), under the engine's lock) is not counted, and
        # an engine given up on is supervised again after one. The window is the runtime's
        # RestartIntensity.
        intensity = RestartIntensity(self.max_restarts, self.restart_period)
        while True:
            process = engine.process
            status = await process.wait()
            async with engine.lock:
                if self._closing:
                    return
                if engine.process is not process:
                    continue
                if not intensity.allow(trio.current_time()):
                    engine.set_state("gave_up")
                    if engine.listener is not None and self._nursery is not None:
                        await self._nursery.start(engine.refuse_while_down)
                    log.error(
                        "%s exited with status %s, more than %d restarts within %s s: the fleet "
                        "gives up on it (it stays down); log tail:\n%s",
                        engine.name, status, self.max_restarts, self.restart_period,
                        await process.read_log_tail(1000),
                    )
                    return
                engine.restarts += 1
                engine.set_state("restarting")
                log.warning("%s exited with status %s; restarting it on port %d (restart %d)",
                            engine.name, status, engine.port, engine.restarts)
                try:
                    await self._replace_process(engine)
                except (FleetStartError, EngineUnauthorizedError) as exc:
                    log.warning("%s did not come back: %s", engine.name, exc)
                    await engine.process.stop(self.grace)
                    continue
                engine.set_state("running")

    async def aclose(self) -> None:
        """Stop the router and every engine (SIGTERM, SIGKILL after ``grace``), in parallel.
        Shielded: returns within about ``grace`` seconds even when cancelled. Nothing is
        restarted from then on."""
        self._closing = True
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as nursery:
                if self.router is not None:
                    nursery.start_soon(self.router.stop, self.grace)
                for engine in self.engines:
                    nursery.start_soon(engine.process.stop, self.grace)
            for engine in self.engines:
                if engine.listener is not None:
                    engine.listener.close()


"""An external server (a vLLM or sglang server outside the pipeline's fleets) as a Fleet.

Attached (``url=``: it runs anyway; never started or stopped here) or launched (``launch=``:
an argv in which ``{port}`` is replaced by a free port of 127.0.0.1, every ``--host`` by
127.0.0.1; stopped by ``stop``). A launched server binds that port itself, so nothing is sent
to it, ``/health`` included, before the listener on the port is proven to be held by the
server's own process group (``_port.owns_port``): a local user who took the port first gets
no request and no key, and the server, unable to bind, exits. A launched server requires a
key (``api_key``, the argv's own ``--api-key``, taken out of the argv and its repr, or a
random one), handed over in its environment (``ACTORSYS_API_KEY`` for the embedded engine,
``VLLM_API_KEY`` for vLLM), which other users cannot read.
Either way it is a :class:`~actorsys.Fleet` of one engine, the client of its flavor, and is
pinned like every fleet, through :meth:`Fleet.pin_and_verify`::

    server = ExternalServer(url="http://10.0.0.7:8000", make_engine=make_engine)
    fleet = await server.fleet()              # waits until it answers, finds its flavor
    verdict = await nursery.start(fleet.pin_and_verify, path, version)

A launched vLLM server is completed by :func:`~actorsys.fleet.vllm_launch.vllm_launch` (the
weight-update endpoints, the key middleware, and the worker extension whose reload handles
tied embeddings unless its argv names a ``--worker-extension-cls`` of its own); how the argv
becomes the server's command and environment is :mod:`~actorsys.fleet.external.launch`.
Nothing is started before the first :meth:`fleet`.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Literal, TypeVar

import trio

from actorsys._errors import ConfigError
from actorsys.fleet._proc.port import until_owned
from actorsys.fleet._proc.process import ManagedProcess, open_log, spawn
from actorsys.fleet._proc.serving import free_port, new_api_key, wait_healthy
from actorsys.fleet.clients._http_engine import check_url
from actorsys.fleet.clients.flavor import FLAVORS, Flavor, engine_of_flavor
from actorsys.fleet.external.launch import argv_key, check_launch, launch_command, without_key
from actorsys.fleet.fleet import Engine, Fleet
from actorsys.fleet.on_all import EngineUnauthorizedError, EngineUnhealthyError
from actorsys.fleet.vllm_launch import EXTENSION_FLAG
from actorsys.runtime import ThreadTracker, run_blocking

__all__ = ["ExternalServer"]

log = logging.getLogger("actorsys.fleet")

POLL_INITIAL_DELAY = 0.25
POLL_MAX_DELAY = 5.0
T = TypeVar("T")
MakeEngine = Callable[[Literal["vllm", "sglang"], str], Engine]


class ExternalServer:
    """One server outside the pipeline's fleets, as a :class:`Fleet` of one engine.

    Exactly one of ``url`` or ``launch`` (an argv with ``{port}``; the process gets
    ``VLLM_SERVER_DEV_MODE=1``, and a vLLM one actorsys' worker extension, see
    ``tied_reload``). ``flavor``: ``"vllm"``, ``"sglang"`` (also the embedded engine) or
    ``"auto"`` (probed once the server answers). ``make_engine(flavor, url)`` builds the
    client, sending ``api_key`` (for a launched server, the key it was started with).
    ``ready_timeout`` bounds the wait for the server, counted from the first
    :meth:`fleet`; ``grace`` the stop. ``owner`` names the caller in argument errors, which
    raise :class:`~actorsys.ConfigError` at construction.
    """

    def __init__(
        self,
        *,
        url: str | None,
        launch: Sequence[str] | None,
        flavor: Flavor,
        make_engine: MakeEngine,
        ready_timeout: float,
        grace: float,
        api_key: str | None = None,
        owner: str = "ExternalServer",
    ) -> None:
        if (url is None) == (launch is None):
            raise ConfigError(f"{owner}(url, launch)", "pass exactly one: url= to attach to "
                              "a running server, launch= to start one")
        if url is not None:
            url = check_url(url, owner)
        if launch is not None:
            check_launch(launch, owner)
        if flavor not in FLAVORS:
            raise ConfigError(f"{owner}(flavor)", f"expected one of {', '.join(FLAVORS)}, "
                              f"got {flavor!r}")
        self.url = url
        self._argv_key = argv_key(launch) if launch is not None else None
        """A key the user wrote into ``launch`` (``--api-key KEY``): kept out of ``launch``
        and the repr, handed to the server in its environment (see :meth:`_start`)."""
        self.launch = without_key(launch) if launch is not None else None
        self.flavor: Flavor = flavor
        self.make_engine = make_engine
        self.ready_timeout = ready_timeout
        self.grace = grace
        self.api_key = api_key
        self.launches_vllm = (
            self.launch is not None
            and flavor != "sglang"
            and any("vllm" in arg for arg in self.launch)
        )
        self.tied_reload = self.launches_vllm and EXTENSION_FLAG not in (self.launch or ())
        """A launched vLLM server gets actorsys' worker extension, whose reload also rebuilds
        a tied ``lm_head`` (vLLM's own leaves its CPU kernel built from the old weights)."""
        self.process: ManagedProcess | None = None
        self.log_path: str | None = None
        self._fleet: Fleet | None = None
        self._port: int | None = None
        self._ready_deadline: float | None = None
        self._threads = ThreadTracker()
        self._files = trio.CapacityLimiter(1)

    def __repr__(self) -> str:
        target = self.url if self.launch is None else f"launch={self.launch!r}"
        return f"ExternalServer({target})"

    async def fleet(self) -> Fleet:
        """The :class:`Fleet` of the server's engine, once the server is ready.

        The first call launches the server (with ``launch=``) and starts the
        ``ready_timeout``; each call waits until the server answers ``GET /health`` and its
        flavor is known, no longer than that deadline. Raises
        :class:`~actorsys.fleet.EngineUnhealthyError` when it is not ready by then, or is
        neither flavor. Blocks on the server; the caller's cancel scope bounds it too.
        """
        if self._fleet is not None:
            return self._fleet
        if self._ready_deadline is None:
            self._ready_deadline = trio.current_time() + self.ready_timeout
            if self.launch is not None:
                await self._start()
        assert self.url is not None
        url, process, port = self.url, self.process, self._port

        async def fail(status: int | None) -> EngineUnhealthyError:
            if status is not None and process is not None:
                return await self._died(process)
            return EngineUnhealthyError(url, f"the server was not ready within "
                                             f"{self.ready_timeout} s{await self._log_tail()}")

        # A launched server binds a port we picked: until its own process group is proven to
        # hold the listener there, nothing (not even /health, which sends the key) goes to
        # whoever else may have taken the port first.
        wait = partial(
            wait_healthy,
            deadline=self._ready_deadline,
            fail=fail,
            exited=(lambda: None) if process is None else (lambda: process.returncode),
            interval=POLL_INITIAL_DELAY,
            max_interval=POLL_MAX_DELAY,
        )
        owned = None if process is None or port is None else partial(until_owned, process, port)
        await wait(lambda: self.make_engine("sglang", url).health(), owned=owned)
        self._fleet = Fleet([await wait(self.detect)])
        return self._fleet

    async def detect(self) -> Engine:
        """The client of the server's flavor (``"auto"``: the first of sglang's and vLLM's
        that reads its weight version). Raises :class:`~actorsys.fleet.EngineUnhealthyError`
        if it answers neither."""
        assert self.url is not None
        url = self.url
        try:
            return await engine_of_flavor(self.flavor, lambda flavor: self.make_engine(flavor, url))
        except EngineUnauthorizedError:
            raise
        except EngineUnhealthyError as exc:
            raise EngineUnhealthyError(url, f"neither an sglang server nor a vLLM server with "
                                            f"its weight-update endpoints ({exc}); pass flavor=") from exc

    async def while_alive(self, call: Callable[[], Awaitable[T]]) -> T:
        """``await call()``, cut short when a launched server dies: then
        :class:`~actorsys.fleet.EngineUnhealthyError` with its exit status and log tail."""
        process = self.process
        if process is None:
            return await call()
        if process.returncode is not None:
            raise await self._died(process)
        result: list[T] = []
        error: list[Exception] = []

        async def run(cancel_scope: trio.CancelScope) -> None:
            try:
                result.append(await call())
            except Exception as exc:
                error.append(exc)
            cancel_scope.cancel()

        async def watch(cancel_scope: trio.CancelScope) -> None:
            await process.wait()
            cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, nursery.cancel_scope)
            nursery.start_soon(watch, nursery.cancel_scope)
        if error:
            raise error[0]
        if not result:
            raise await self._died(process)
        return result[0]

    async def stop(self) -> None:
        """Stop a launched server (SIGTERM to its process group, SIGKILL after ``grace``) and
        remove its log; forget the fleet, killing its reference worker. Shielded: returns
        within about twice ``grace`` even when cancelled. An attached server is only
        forgotten."""
        process, self.process = self.process, None
        fleet, self._fleet = self._fleet, None
        self._ready_deadline = None
        if fleet is not None:
            await fleet.aclose()
        if process is not None:
            await process.stop(self.grace)
            log.info("stopped the server %s (status %s)", process.name, process.returncode)
        log_path, self.log_path = self.log_path, None
        if log_path is not None:
            with trio.CancelScope(shield=True):
                await self._in_thread(lambda: _remove(log_path), f"removal of {log_path}")

    async def _start(self) -> None:
        assert self.launch is not None
        port = free_port()
        self.api_key = self.api_key or self._argv_key or new_api_key()
        argv, env = launch_command(
            self.launch, port, api_key=self.api_key, key_in_argv=self._argv_key,
            launches_vllm=self.launches_vllm, tied_reload=self.tied_reload,
        )
        log_path = self.log_path = await self._in_thread(_new_log, "creation of the server's log")
        log_fd = await self._in_thread(lambda: open_log(log_path), f"opening {log_path}")
        # Forked from this (the evaluating trio) thread: the server lives as long as it.
        self.process = spawn("eval-server", argv, log_path=log_path, env=env, grace=self.grace,
                             log_fd=log_fd)
        self.url = f"http://127.0.0.1:{port}"
        self._port = port
        log.info("launched the server %s at %s (log %s)", argv[0], self.url, self.log_path)

    async def _in_thread(self, fn: Callable[[], T], description: str) -> T:
        return await run_blocking(fn, abandon_on_cancel=False, limiter=self._files,
                                  description=description, tracker=self._threads)

    async def _died(self, process: ManagedProcess) -> EngineUnhealthyError:
        return EngineUnhealthyError(str(self.url), f"the launched server exited with status "
                                                   f"{process.returncode}{await self._log_tail()}")

    async def _log_tail(self) -> str:
        tail = await self.process.read_log_tail(2000) if self.process is not None else ""
        return f"; its log ends:\n{tail}" if tail else ""


def _new_log() -> str:
    handle, path = tempfile.mkstemp(prefix="actorsys-eval-server-", suffix=".log")
    os.close(handle)
    return path


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass

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
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import struct
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
import trio

from actorsys._errors import ActorsysError, ConfigError
from actorsys._tls import ssl_context
from actorsys.fleet._port import held_listener, until_owned
from actorsys.fleet._process import ManagedProcess, spawn
from actorsys.fleet.embedded import API_KEY_ENV as ENGINE_API_KEY_ENV
from actorsys.fleet.engine import Engine, Fleet
from actorsys.fleet.sglang import SGLangEngine
from actorsys.fleet.vllm import RELOAD, TIED_RELOAD, VLLMEngine
from actorsys.fleet.vllm_launch import (
    VLLM_INHERITED_MODULE,
    VLLM_SERVER_MODULE,
    VLLMLaunch,
    vllm_command,
    vllm_launch,
)
from actorsys.fleet.vllm_worker.actorsys_api_key import KEY_ENV as VLLM_API_KEY_ENV
from actorsys.runtime import RestartIntensity

log = logging.getLogger("actorsys.fleet")

HEALTH_POLL_INTERVAL = 0.25
VLLM_PYTHON = ".venv-vllm/bin/python"
ROUTER_KEY_ENV = "ACTORSYS_ROUTER_ADMIN_KEY"
ROUTER_MAIN = (
    "import os, sys; from sglang_router.launch_router import launch_router, parse_router_args; "
    "launch_router(parse_router_args([*sys.argv[1:], '--control-plane-api-keys', "
    f"'actorsys:fleet:admin:' + os.environ.pop({ROUTER_KEY_ENV!r})]))"
)
"""sglang-router's launcher, with its control plane (``/workers``: add or remove a worker)
locked by a random key that nobody holds: otherwise anyone who can connect could add a server
of theirs and receive the fleet's requests, key included. The key goes through the
environment, so no command line shows it. The data plane passes each request's
``Authorization`` header on to the engine, which checks the fleet's key."""


class FleetStartError(ActorsysError, RuntimeError):
    """A process of a local fleet did not come up; the message holds its log's tail."""


@dataclass(frozen=True)
class EngineSpec:
    """How to start one engine: its command for a given port, its environment, its client.

    ``api_key_env``: the environment variable the engine reads its API key from (None: it
    takes none). The fleet that starts it sets it to the fleet's key (the environment, unlike
    the command line, is hidden from other users) and builds the client as
    ``client(url, name, key)``; without one, as ``client(url, name)``.

    ``listen(argv, fd)``: ``argv`` changed to serve the listening socket it inherits at
    descriptor ``fd`` (bound by the fleet to 127.0.0.1 and ``argv``'s port) instead of binding
    one (None: the server binds its own port, and the fleet proves the listener is the
    server's before it sends anything there).
    """

    kind: str
    command: Callable[[int], list[str]]
    client: Callable[..., Engine]
    env: Mapping[str, str] = field(default_factory=dict)
    api_key_env: str | None = None
    listen: Callable[[list[str], int], list[str]] | None = None

    def environment(self, api_key: str | None) -> dict[str, str]:
        """The engine's whole environment: this process's, ``env``, and its key."""
        key = {self.api_key_env: api_key} if self.api_key_env and api_key else {}
        return {**os.environ, **self.env, **key}

    def make_client(self, url: str, name: str, api_key: str | None) -> Engine:
        if self.api_key_env is None:
            return self.client(url, name)
        return self.client(url, name, api_key)


def new_api_key() -> str:
    """A random key for the engines of one fleet."""
    return secrets.token_urlsafe(32)


def embedded(model_dir: str, *, extra_args: Sequence[str] = (), threads: int = 1) -> EngineSpec:
    """The embedded CPU engine serving ``model_dir`` (``extra_args`` go to its command line)."""
    model_dir = os.path.abspath(model_dir)
    return EngineSpec(
        kind="embedded",
        command=lambda port: [
            sys.executable, "-m", "actorsys", "engine", "--model", model_dir,
            "--host", "127.0.0.1", "--port", str(port), "--threads", str(threads), *extra_args,
        ],
        client=lambda url, name, key: SGLangEngine(url, name=name, api_key=key),
        api_key_env=ENGINE_API_KEY_ENV,
        listen=lambda argv, fd: [*argv, "--listen-fd", str(fd)],
    )


def vllm(
    model_dir: str,
    *,
    python: str = VLLM_PYTHON,
    max_model_len: int = 512,
    kv_cache_bytes: int = 64 * 1024 * 1024,
    extra_args: Sequence[str] = (),
    tied_reload: bool = True,
    tool_call_parser: str | None = None,
) -> EngineSpec:
    """A vLLM OpenAI server on the CPU serving ``model_dir``, from the venv of ``python``
    (``scripts/setup_vllm.sh`` makes ``.venv-vllm``), with the weight-update endpoints on.

    The server gets actorsys' worker extension (``actorsys/fleet/vllm_worker``, put on its
    ``PYTHONPATH``) and its client reloads through it: vLLM 0.32's own ``reload_weights``
    leaves the CPU kernel of a tied ``lm_head`` built from the previous weights, so a model
    with tied embeddings would answer with the new body and the old head. The extension's
    ``reload_weights_tied`` reloads, then rebuilds that kernel (about 35 ms for a tiny model;
    a no-op for untied models). The checkpoint files need no change. ``tied_reload=False``
    starts the server as a user would, with vLLM's own reload (the weight probe then catches
    a tied model served wrong). ``tool_call_parser`` (``"hermes"``...): the chat endpoint reads
    tool calls in the answers into ``tool_calls``, as the CPU engine does for Hermes calls.
    """
    model_dir = os.path.abspath(model_dir)
    python = os.path.abspath(python)

    def launch(port: int) -> VLLMLaunch:
        command = vllm_command(python, model_dir, port, max_model_len=max_model_len,
                               kv_cache_bytes=kv_cache_bytes, tool_call_parser=tool_call_parser,
                               extra_args=extra_args)
        return vllm_launch(command, tied_reload=tied_reload)

    return EngineSpec(
        kind="vllm",
        command=lambda port: launch(port).argv,
        client=lambda url, name, key: VLLMEngine(
            url,
            name=name,
            api_key=key,
            served_model_dir=model_dir,
            reload_method=TIED_RELOAD if tied_reload else RELOAD,
        ),
        env=launch(0).env,
        api_key_env=VLLM_API_KEY_ENV,
        listen=serve_inherited,
    )


def serve_inherited(argv: list[str], fd: int) -> list[str]:
    """A vLLM server command (from :func:`vllm_command`) that serves the listening socket at
    descriptor ``fd`` through ``actorsys_vllm_serve`` (in ``vllm_worker``) instead of binding."""
    module = argv.index(VLLM_SERVER_MODULE)
    return [*argv[:module], VLLM_INHERITED_MODULE, "--listen-fd", str(fd), *argv[module + 1 :]]


@dataclass
class LocalEngine:
    """One engine of a local fleet. ``state``: ``"running"``, ``"restarting"`` (it exited and
    is being started again) or ``"gave_up"`` (it exited too often; it stays down);
    ``restarts``: how often the fleet restarted it on its own."""

    name: str
    spec: EngineSpec
    port: int
    process: ManagedProcess
    client: Engine
    state: str = "running"
    restarts: int = 0
    listener: socket.socket | None = field(default=None, repr=False)
    """The listening socket the fleet bound for the engine and holds until it closes (None:
    the engine binds its own port)."""
    door: trio.CancelScope | None = field(default=None, repr=False)
    """While the fleet gave up on the engine: the task that refuses connections to its port."""
    lock: trio.Lock = field(default_factory=trio.Lock, repr=False)
    _changed: trio.Event = field(default_factory=trio.Event, repr=False)

    def set_state(self, state: str) -> None:
        self.state = state
        self._changed.set()
        self._changed = trio.Event()

    async def wait_state(self, state: str, *, restarts: int = 0) -> None:
        """Block until the engine is in ``state`` after at least ``restarts`` restarts."""
        while not (self.state == state and self.restarts >= restarts):
            await self._changed.wait()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


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
        directory = tempfile.mkdtemp(prefix="actorsys-fleet-") if log_dir is None else log_dir
        os.makedirs(directory, exist_ok=True)
        local = cls(directory, grace, startup_timeout, max_restarts, restart_period)
        try:
            for index, spec in enumerate(specs):
                local.engines.append(local._start_engine(f"{spec.kind}-{index}", spec))
            for engine in local.engines:
                await local._wait_healthy(engine.process, engine.url,
                                          proven=engine.listener is not None)
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
                shutil.rmtree(directory, ignore_errors=True)

    @property
    def urls(self) -> list[str]:
        return [engine.url for engine in self.engines]

    def _start_engine(
        self, name: str, spec: EngineSpec, port: int | None = None,
        listener: socket.socket | None = None,
    ) -> LocalEngine:
        """Start one engine. With ``spec.listen`` it serves ``listener`` (a new one, bound
        here, if None); otherwise it binds ``port`` (a free one if None) itself."""
        fds: list[int] = []
        if spec.listen is not None:
            listener = held_listener(port=port or 0) if listener is None else listener
            port = int(listener.getsockname()[1])
            command = spec.listen(spec.command(port), listener.fileno())
            fds = [listener.fileno()]
        else:
            listener = None
            port = free_port() if port is None else port
            command = spec.command(port)
        process = spawn(
            name,
            command,
            log_path=self._log_path(f"{name}.log"),
            env=spec.environment(self.api_key),
            grace=self.grace,
            pass_fds=fds,
        )
        url = f"http://127.0.0.1:{port}"
        return LocalEngine(name, spec, port, process, spec.make_client(url, name, self.api_key),
                           listener=listener)

    def _log_path(self, name: str) -> str:
        """``name`` in the log directory (``spawn`` opens it without following links)."""
        return os.path.join(self.log_dir, name)

    async def _start_router(self) -> None:
        port, metrics_port = free_port(), free_port()
        command = [
            sys.executable, "-c", ROUTER_MAIN,
            "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            "--policy", "round_robin", "--log-level", "warn",
            "--worker-urls", *self.urls,
        ]
        self.router = spawn(
            "router",
            command,
            log_path=self._log_path("router.log"),
            env={**os.environ, ROUTER_KEY_ENV: new_api_key()},
            grace=self.grace,
        )
        self.router_url = f"http://127.0.0.1:{port}"
        await self._wait_healthy(self.router, self.router_url, proven=False)

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
        started = self._start_engine(engine.name, engine.spec, engine.port, engine.listener)
        engine.process, engine.listener = started.process, started.listener
        await self._wait_healthy(engine.process, engine.url, proven=engine.listener is not None)

    async def _watch_router(self, router: ManagedProcess) -> None:
        """When the router exits, send the fleet's requests to the engines themselves: the
        router's port is free from then on, and another user could take it (sglang-router
        binds its own port and cannot serve a socket the fleet holds)."""
        status = await router.wait()
        if self._closing:
            return
        log.error("the router exited with status %s; the fleet's requests go to its engines "
                  "directly from now on (its port is not ours any more); log tail:\n%s",
                  status, router.log_tail(1000))
        self.router_url = None
        self.fleet.router_url = None

    async def _supervise(self, engine: LocalEngine) -> None:
        """Restart ``engine`` whenever its process exits, within the restart intensity."""
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
                        await self._nursery.start(self._refuse_while_down, engine)
                    log.error(
                        "%s exited with status %s, more than %d restarts within %s s: the fleet "
                        "gives up on it (it stays down); log tail:\n%s",
                        engine.name, status, self.max_restarts, self.restart_period,
                        process.log_tail(1000),
                    )
                    return
                engine.restarts += 1
                engine.set_state("restarting")
                log.warning("%s exited with status %s; restarting it on port %d (restart %d)",
                            engine.name, status, engine.port, engine.restarts)
                try:
                    await self._replace_process(engine)
                except FleetStartError as exc:
                    log.warning("%s did not come back: %s", engine.name, exc)
                    await engine.process.stop(self.grace)
                    continue
                engine.set_state("running")

    async def _refuse_while_down(
        self, engine: LocalEngine, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Reset every connection to ``engine``'s port until :meth:`restart` (the fleet gave up
        on it). The fleet keeps the port, so its clients would otherwise wait in the backlog
        for an engine that is not coming; reset, they fail at once, as on a closed port."""
        listener = engine.listener
        assert listener is not None
        with trio.CancelScope() as door:
            engine.door = door
            task_status.started()
            listener.setblocking(False)
            while True:
                await trio.lowlevel.wait_readable(listener)
                try:
                    connection, _ = listener.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                connection.close()

    async def _wait_healthy(self, process: ManagedProcess, url: str, *, proven: bool) -> None:
        """Wait until ``process`` answers ``GET {url}/health`` with 200. Unless ``proven``
        (it serves a socket the fleet bound), first until the listener on the URL's port is
        held by the process's own group: nothing goes to a port another process took."""
        with trio.move_on_after(self.startup_timeout):
            if not proven:
                await until_owned(process, int(url.rpartition(":")[2]))
            async with httpx.AsyncClient(timeout=5.0, verify=ssl_context()) as client:
                while process.returncode is None:
                    try:
                        response = await client.get(f"{url}/health")
                        if response.status_code == 200:
                            return
                    except httpx.HTTPError:
                        pass
                    await trio.sleep(HEALTH_POLL_INTERVAL)
                raise FleetStartError(
                    f"{process.name} exited with status {process.returncode} before it was "
                    f"healthy; log tail:\n{process.log_tail()}"
                )
        raise FleetStartError(
            f"{process.name} was not healthy at {url} within {self.startup_timeout} s; "
            f"log tail:\n{process.log_tail()}"
        )

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


def on_host(argv: Sequence[str], host: str) -> list[str]:
    """``argv`` with the value of every ``--host`` replaced by ``host`` (added if it has
    none): a second ``--host`` appended after the first would leave which one wins to the
    server's parser."""
    argv = [f"--host={host}" if arg.startswith("--host=") else arg for arg in argv]
    places = [i + 1 for i, arg in enumerate(argv[:-1]) if arg == "--host"]
    for place in places:
        argv[place] = host
    found = places or any(arg.startswith("--host=") for arg in argv)
    return argv if found else [*argv, "--host", host]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now. Another process may take it
    before it is used: a server started on it must be proven to hold it
    (:func:`actorsys.fleet._port.owns_port`) before anything is sent there."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

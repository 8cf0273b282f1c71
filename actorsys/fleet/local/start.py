"""Starting one process of a :class:`~actorsys.fleet.local.LocalFleet` on loopback, and the
wait until it is healthy.

An engine serves the listening socket the fleet binds for it and holds (``EngineSpec.listen``,
see ``_port``), or else binds a free port itself; the router binds its own ports. Each runs
under a reaper in its own process group (``_process``), its output appended to a log file in
the fleet's log directory, its key in its environment. :func:`wait_started` is the fleets' one
health wait (``_loopback.wait_healthy``) for such a process: a process that binds its own port
is first proven to hold it, and one that exits, or is not healthy in time, raises
:class:`FleetStartError` with its log tail.
"""

from __future__ import annotations

import os
import socket
import tempfile
from functools import partial

import trio

from actorsys.fleet._proc.port import held_listener, until_owned
from actorsys.fleet._proc.process import ManagedProcess, start
from actorsys.fleet._proc.serving import free_port, get_health, new_api_key, wait_healthy
from actorsys.fleet.local.engine import LocalEngine
from actorsys.fleet.local.specs import ROUTER_KEY_ENV, EngineSpec, router_command
from actorsys.fleet.on_all import FleetStartError


async def start_engine(
    name: str,
    spec: EngineSpec,
    *,
    log_dir: str,
    api_key: str,
    grace: float,
    port: int | None = None,
    listener: socket.socket | None = None,
) -> LocalEngine:
    """Start one engine, its client sending ``api_key``. With ``spec.listen`` it serves
    ``listener`` (a new one, bound here, if None); otherwise it binds ``port`` (a free one if
    None) itself."""
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
    process = await start(
        name,
        command,
        log_path=log_path(log_dir, f"{name}.log"),
        env=spec.environment(api_key),
        grace=grace,
        pass_fds=fds,
    )
    url = f"http://127.0.0.1:{port}"
    return LocalEngine(name, spec, port, process, spec.make_client(url, name, api_key),
                       listener=listener)


async def start_router(worker_urls: list[str], *, log_dir: str, grace: float) -> tuple[ManagedProcess, str]:
    """Start sglang-router over ``worker_urls`` on a free port; the process and its URL."""
    port, metrics_port = free_port(), free_port()
    router = await start(
        "router",
        router_command(port, metrics_port, worker_urls),
        log_path=log_path(log_dir, "router.log"),
        env={**os.environ, ROUTER_KEY_ENV: new_api_key()},
        grace=grace,
    )
    return router, f"http://127.0.0.1:{port}"


async def wait_started(
    process: ManagedProcess, url: str, *, startup_timeout: float, proven: bool
) -> None:
    """Wait until ``process`` answers ``GET {url}/health`` with 200 (see
    :func:`~actorsys.fleet._proc.serving.wait_healthy`). Unless ``proven`` (it serves a
    socket the fleet bound), first until the listener on the URL's port is held by the
    process's own group: nothing goes to a port another process took."""

    async def fail(status: int | None) -> FleetStartError:
        tail = await process.read_log_tail()
        if status is None:
            return FleetStartError(f"{process.name} was not healthy at {url} within "
                                   f"{startup_timeout} s; log tail:\n{tail}")
        return FleetStartError(f"{process.name} exited with status {status} before it was "
                               f"healthy; log tail:\n{tail}")

    port = int(url.rpartition(":")[2])
    await wait_healthy(
        get_health(url, process.name),
        deadline=trio.current_time() + startup_timeout,
        fail=fail,
        exited=lambda: process.returncode,
        owned=None if proven else partial(until_owned, process, port),
    )


def log_directory(log_dir: str | None) -> str:
    """``log_dir``, made if missing; a new temporary directory if None. Blocking."""
    if log_dir is None:
        return tempfile.mkdtemp(prefix="actorsys-fleet-")
    os.makedirs(log_dir, exist_ok=True)
    return log_dir


def log_path(log_dir: str, name: str) -> str:
    """``name`` in the log directory (``start`` opens it without following links)."""
    return os.path.join(log_dir, name)

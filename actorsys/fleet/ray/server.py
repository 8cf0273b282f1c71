"""The body of a :class:`~actorsys.fleet.ray.RayFleet`'s engine actor: one engine server on
the actor's node, under a reaper, started on a port of the node's address, waited for until
healthy, and watched: when the server exits, the actor's process ends with it, so that Ray
restarts the actor or marks it dead.

This code runs inside the actor (plain code on Ray's thread, not under trio), never in the
driver.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from functools import partial

import trio

from actorsys._errors import ConfigError
from actorsys.fleet._proc.port import held_listener, until_owned
from actorsys.fleet._proc.process import ManagedProcess, spawn
from actorsys.fleet._proc.serving import free_port, get_health, on_host, wait_healthy
from actorsys.fleet.local.specs import EngineSpec
from actorsys.fleet.on_all import FleetStartError


class EngineServer:
    """The body of an engine actor: one engine server on this node, watched.

    The server binds the node's address on a free port, since the driver may run on another
    node, and so it answers only requests with the fleet's key (``api_key``, handed to it in
    its environment), but for ``/health``. When it exits, a watcher thread ends the actor's
    process, so that Ray restarts the actor (within its ``max_restarts``) or marks it dead;
    either way calls to it fail until it is back, and the pin says ``unhealthy``.
    """

    def __init__(
        self,
        name: str,
        spec: EngineSpec,
        startup_timeout: float,
        grace: float,
        api_key: str | None = None,
    ) -> None:
        import ray

        if spec.api_key_env is None or not api_key:
            raise ConfigError("RayFleet", f"a {spec.kind} engine reachable from other nodes "
                              "needs a key, and this one takes none")
        host = ray.util.get_node_ip_address()
        # As in a local fleet (see ``_port``): the server serves a socket bound here, so its
        # port is never free for another user of the node to take; one that binds its own
        # is proven to hold it before anything is sent there.
        self._listener = held_listener(host) if spec.listen is not None else None
        port = free_port() if self._listener is None else int(self._listener.getsockname()[1])
        command = on_host(spec.command(port), host)
        if self._listener is not None and spec.listen is not None:
            command = spec.listen(command, self._listener.fileno())
        self._port = port
        self._log_dir = tempfile.mkdtemp(prefix="actorsys-ray-engine-")
        self._url = f"http://{host}:{port}"
        self._process: ManagedProcess = spawn(
            name,
            command,
            log_path=os.path.join(self._log_dir, f"{name}.log"),
            env=spec.environment(api_key),
            grace=grace,
            pass_fds=[] if self._listener is None else [self._listener.fileno()],
        )
        self._wait_healthy(startup_timeout)
        threading.Thread(target=self._exit_with_server, name="engine-watch", daemon=True).start()

    def _wait_healthy(self, startup_timeout: float) -> None:
        """The fleets' one health wait (:func:`~actorsys.fleet._proc.serving.wait_healthy`), in a
        trio run of this actor's own: its constructor is plain code on Ray's thread."""
        process, url = self._process, self._url

        async def fail(status: int | None) -> FleetStartError:
            tail = process.log_tail()  # this trio run waits for nothing else meanwhile
            if status is None:
                process.signal_group(signal.SIGKILL)
                return FleetStartError(f"engine server not healthy at {url} within "
                                       f"{startup_timeout} s; log tail:\n{tail}")
            return FleetStartError(f"engine server exited with status {status} before it was "
                                   f"healthy; log tail:\n{tail}")

        async def wait() -> None:
            await wait_healthy(
                get_health(url, process.name),
                deadline=trio.current_time() + startup_timeout,
                fail=fail,
                exited=lambda: process.returncode,
                owned=None if self._listener is not None else partial(
                    until_owned, process, self._port),
            )

        trio.run(wait)

    def _exit_with_server(self) -> None:
        status = self._process.wait_blocking()
        print(f"engine server at {self._url} exited with status {status}; ending the actor",
              flush=True)
        os._exit(1)

    def url(self) -> str:
        """The server's base URL; raises if the server has exited."""
        if self._process.returncode is not None:
            raise RuntimeError(f"engine server exited with status {self._process.returncode}")
        return self._url

    def pids(self) -> tuple[int, int | None]:
        """This actor's pid and the engine server's (None once it has ended)."""
        return os.getpid(), self._process.command_pid()

    def log_tail(self) -> str:
        return self._process.log_tail()

    def node_id(self) -> str:
        """The Ray node this actor (and its server) runs on."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

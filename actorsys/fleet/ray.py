"""RayFleet: inference engines that run as Ray actors, pinned through the Engine protocol.

Example::

    ray.init()
    async with RayFleet.open(model_dir, num_engines=2, resources={"num_cpus": 1},
                             max_restarts=3) as ray_fleet:
        async with EvalSupervisor.open(config, eval_fn=MyEval(), fleet=ray_fleet.fleet) as sup:
            ...

Ray places each engine actor; the actor starts its engine server (the embedded CPU engine, or
a vLLM server from ``.venv-vllm``) on its node under a reaper, so the server dies with the
actor, and reports the server's URL. The fleet's engines are :class:`RayEngine` objects: a
health check asks the actor for its URL, so a dead actor is ``unhealthy`` and an actor Ray
restarted is reached at its new URL; the load and the version read-back go over HTTP to that
URL through the engine's own client. A restarted server starts from ``model_dir``, never from
the last snapshot: the next pin loads the snapshot and reads its version back, as for any
engine.

Every Ray call the engines make is awaited from trio through ``ObjectRef.future()``, and
cancelling the waiting task calls ``ray.cancel``; ``open`` also runs under asyncio, where the
wait for the actors to start goes through ``asyncio.wrap_future``. Ray is imported only when
a fleet is opened: ``import actorsys`` works without it (the ``ray`` extra installs it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any, TypeVar

import sniffio
import trio

from actorsys._errors import ConfigError
from actorsys.fleet._loopback import free_port, get_health, new_api_key, on_host, wait_healthy
from actorsys.fleet._port import held_listener, until_owned
from actorsys.fleet._process import ManagedProcess, spawn
from actorsys.fleet.engine import Engine, EngineUnhealthyError, Fleet
from actorsys.fleet.errors import FleetStartError
from actorsys.fleet.flags import fleet_flags_from_args
from actorsys.fleet.probe import ProbedEngine, ProbeUnsupportedError
from actorsys.fleet.specs import VLLM_PYTHON, EngineSpec, embedded, vllm
from actorsys.runtime import ThreadTracker, run_blocking, wait_future

log = logging.getLogger("actorsys.fleet")

T = TypeVar("T")

ENGINES = ("embedded", "vllm")
DEFAULT_RESOURCES: Mapping[str, Any] = {"num_cpus": 1}
ACTOR_ANSWER_TIMEOUT = 10.0
"""Seconds an engine actor has to say where its server is. A live actor answers in
milliseconds; one that Ray is restarting, or cannot place (its node is gone and no other has
room), would hold the call until it is back: the pin says ``unhealthy`` instead."""


async def await_ref(ref: Any, *, force: bool = False) -> Any:
    """The value of the Ray ``ObjectRef`` ``ref``, awaited from trio.

    Blocks the calling task (not the trio thread) on ``ref.future()``. Cancelling the task
    calls ``ray.cancel(ref, force=force)`` and returns at once. A queued task never runs; a
    running one is interrupted where Ray can: an async actor's task is cancelled, a plain
    task's worker is killed only with ``force=True``, a sync actor's method runs on.
    """
    import ray

    def cancel() -> None:
        try:
            ray.cancel(ref, force=force)
        except Exception as exc:
            log.warning("ray.cancel(%s) failed: %r", ref, exc)

    return await wait_future(ref.future(), cancel=cancel)


async def _all_answer(refs: list[Any]) -> None:
    """Wait for every ref, under trio or under asyncio (an asyncio driver may open a fleet
    too; its engines are then used from the bridge's trio thread)."""
    if sniffio.current_async_library() == "asyncio":
        await asyncio.gather(*(asyncio.wrap_future(ref.future()) for ref in refs))
        return
    async with trio.open_nursery() as nursery:
        for ref in refs:
            nursery.start_soon(await_ref, ref)


def _import_ray() -> Any:
    import ray

    return ray


def _kill(ray: Any, actors: Sequence[Any]) -> None:
    if ray.is_initialized():
        for actor in actors:
            ray.kill(actor, no_restart=True)


class _RayCalls:
    """The blocking calls of a fleet's driver into Ray (its import, creating and killing
    actors), each in a worker thread, under trio (tracked in ``threads``) or asyncio: the
    event loop's thread never waits on Ray's control store."""

    def __init__(self) -> None:
        self.threads = ThreadTracker()
        under_trio = sniffio.current_async_library() == "trio"
        self._limiter = trio.CapacityLimiter(1) if under_trio else None

    async def __call__(self, fn: Callable[[], T], description: str, *, abandon: bool = True) -> T:
        """``fn()`` in a worker thread; with ``abandon``, left to run on when the caller is
        cancelled, else waited for."""
        if self._limiter is None:
            return await asyncio.to_thread(fn)
        return await run_blocking(fn, abandon_on_cancel=abandon, limiter=self._limiter,
                                  description=description, tracker=self.threads)

    async def shielded(self, fn: Callable[[], None], description: str, bound: float) -> None:
        """``fn()`` also while the caller is cancelled, waited for ``bound`` seconds at
        most (then it runs on in its thread)."""
        if self._limiter is None:
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.to_thread(fn)), bound)
            except TimeoutError:
                log.warning("%s: not done within %s s; it goes on in its thread",
                            description, bound)
            return
        with trio.CancelScope(shield=True), trio.move_on_after(bound) as waited:
            await self(fn, description)
        if waited.cancelled_caught:
            log.warning("%s: not done within %s s; it goes on in its thread", description, bound)


def engine_spec(engine: str, model_dir: str, engine_args: Sequence[str]) -> EngineSpec:
    """The command, environment and client of one engine of kind ``engine``."""
    if engine == "embedded":
        return embedded(model_dir, extra_args=engine_args)
    if engine == "vllm":
        # Resolved here: the actor runs in a working directory of Ray's.
        return vllm(model_dir, python=os.path.abspath(VLLM_PYTHON), extra_args=engine_args)
    raise ConfigError("RayFleet.open(engine)", f"expected one of {ENGINES}, got {engine!r}")


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
        """The fleets' one health wait (:func:`~actorsys.fleet._loopback.wait_healthy`), in a
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


class RayEngine:
    """The :class:`~actorsys.Engine` of one engine actor.

    Every method first asks the actor for its server's URL (a dead or restarting actor
    raises :class:`~actorsys.fleet.EngineUnhealthyError`), then calls the server there over
    HTTP, so a server Ray restarted elsewhere is never mistaken for the one pinned before.
    Every method blocks on Ray or on the server; the caller's cancel scope bounds it.
    """

    def __init__(self, actor: Any, name: str, spec: EngineSpec, api_key: str | None = None) -> None:
        self.actor = actor
        self.name = name
        self.api_key = api_key
        self._spec = spec
        self._client: Engine | None = None
        self.url: str | None = None
        self.answer_timeout = ACTOR_ANSWER_TIMEOUT

    def __repr__(self) -> str:
        return f"RayEngine({self.name!r}, url={self.url!r})"

    async def health(self) -> None:
        await (await self._current()).health()

    async def load_weights(self, path: str, version: str) -> None:
        await (await self._current()).load_weights(path, version)

    async def weight_version(self) -> str | None:
        return await (await self._current()).weight_version()

    async def greedy_tokens(
        self, prompts: Sequence[Sequence[int]], max_tokens: int
    ) -> list[list[int]]:
        """The weight probe, asked of the server the actor runs now."""
        client = await self._current()
        if not isinstance(client, ProbedEngine):
            raise ProbeUnsupportedError(f"{type(client).__name__} has no token probe")
        return await client.greedy_tokens(prompts, max_tokens)

    async def _current(self) -> Engine:
        """The client of the server the actor runs now (a restarted actor's is new)."""
        import ray

        try:
            with trio.fail_after(self.answer_timeout):
                url = await await_ref(self.actor.url.remote())
        except ray.exceptions.RayError as exc:
            raise EngineUnhealthyError(self.name, f"its actor is not serving: {exc}") from exc
        except trio.TooSlowError as exc:
            raise EngineUnhealthyError(
                self.name, f"its actor did not answer within {self.answer_timeout} s "
                "(restarting, or no node can place it)",
            ) from exc
        if url != self.url or self._client is None:
            self._client = self._spec.make_client(url, self.name, self.api_key)
            self.url = url
        return self._client


class RayFleet:
    """Engine actors and the :class:`~actorsys.Fleet` of their engines.

    ``fleet``: the Fleet to hand to the supervisor. ``actors``: the Ray actor handles, in
    engine order. ``engines``: the :class:`RayEngine` of each. ``api_key``: the fleet's random
    key, which its engines require and its clients send.
    """

    def __init__(
        self, actors: list[Any], engines: list[RayEngine], api_key: str | None = None
    ) -> None:
        self.actors = actors
        self.engines = engines
        self.api_key = api_key
        self.fleet = Fleet(engines)

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        model_dir: str | os.PathLike[str],
        *,
        num_engines: int,
        engine: str = "embedded",
        engine_args: Sequence[str] = (),
        resources: Mapping[str, Any] | None = None,
        max_restarts: int = 0,
        startup_timeout: float = 600.0,
        grace: float = 5.0,
    ) -> AsyncIterator[RayFleet]:
        """Start ``num_engines`` engine actors serving ``model_dir``; yield once every one
        reports its URL; kill them all on the way out.

        ``engine``: ``"embedded"`` or ``"vllm"``; ``engine_args`` go to its command line.
        ``resources``: options of each actor for Ray's placement (``num_cpus``, ``num_gpus``,
        ``resources``, ``scheduling_strategy``...; default one CPU). ``max_restarts``: how
        often Ray restarts an actor whose server or process died. Blocks until the servers
        are healthy (at most ``startup_timeout`` seconds each); the caller's cancel scope
        bounds it. An engine that does not come up raises :class:`FleetStartError`. Uses the
        Ray cluster ``ray.init`` connected to (Ray starts a local one if none). Opens under
        trio or asyncio; the fleet's engines are used under trio (by the supervisor, or a
        bridge's trio thread).
        """
        if not isinstance(num_engines, int) or num_engines < 1:
            raise ConfigError(
                "RayFleet.open(num_engines)", f"expected an integer >= 1, got {num_engines!r}"
            )
        if not isinstance(max_restarts, int) or max_restarts < -1:
            raise ConfigError(
                "RayFleet.open(max_restarts)",
                f"expected an integer >= 0 (-1: without end), got {max_restarts!r}",
            )
        spec = engine_spec(engine, os.fspath(model_dir), tuple(engine_args))
        options = dict(DEFAULT_RESOURCES if resources is None else resources)
        names = [f"ray-{engine}-{index}" for index in range(num_engines)]
        key = new_api_key()
        calls = _RayCalls()
        ray = await calls(_import_ray, "import ray")

        actors: list[Any] = []
        held: list[Any] = []

        def start() -> list[Any]:
            remote_class: Any = ray.remote(EngineServer)
            actor_class = remote_class.options(
                max_restarts=max_restarts, max_task_retries=0, **options
            )
            # The key travels as a reference to an object of this driver, never as an
            # argument value: an actor's creation arguments are kept in Ray's control store
            # (for its restarts) and shown by its tools; the reference is resolved into the
            # actor only. The reference is held as long as the fleet is open: Ray resolves it
            # again whenever it restarts an actor, and frees its object once nothing holds it.
            key_ref = ray.put(key)
            held.append(key_ref)
            for name in names:
                actors.append(actor_class.remote(name, spec, startup_timeout, grace, key_ref))
            return [actor.url.remote() for actor in actors]

        try:
            # Waited for even when cancelled: every actor it made is in ``actors``, killed below.
            urls = await calls(start, "create the engine actors", abandon=False)
            try:
                await _all_answer(urls)
            except* ray.exceptions.RayError as failed:
                raise FleetStartError(
                    f"an engine actor did not come up: {failed.exceptions[0]}"
                ) from failed
            engines = [RayEngine(a, n, spec, key) for a, n in zip(actors, names, strict=True)]
            yield cls(actors, engines, key)
        finally:
            await calls.shielded(partial(_kill, ray, actors), "kill the engine actors",
                                 ACTOR_ANSWER_TIMEOUT)

    # -- the dedicated eval fleet from the trainer's flags ---------------------------------

    @classmethod
    def from_args(
        cls,
        args: argparse.Namespace,
        model_dir: str | os.PathLike[str],
        *,
        resources: Mapping[str, Any] | None = None,
        engine_args: Sequence[str] = (),
        max_restarts: int = 0,
        startup_timeout: float = 600.0,
    ) -> AbstractAsyncContextManager[RayFleet]:
        """:meth:`open` as the fleet flags in ``args`` say (``EvalConfig.add_arguments``
        adds them): ``--eval-num-gpus N // --eval-num-gpus-per-engine G`` engines of
        ``--eval-engine``, each an actor with ``num_gpus=G``; with ``--eval-num-gpus 0`` (or
        unset) one engine on one CPU. ``resources`` adds to (or overrides) each actor's
        options, e.g. ``{"scheduling_strategy": "SPREAD"}`` for one engine per node where
        the GPUs allow. A vLLM engine of several GPUs gets ``--tensor-parallel-size G``.
        Runs on the cluster ``ray.init`` connected to; blocks as :meth:`open` does.
        """

        flags = fleet_flags_from_args(args)
        extra = tuple(engine_args)
        if flags.engine == "vllm" and flags.num_gpus and flags.num_gpus_per_engine > 1:
            extra = ("--tensor-parallel-size", str(flags.num_gpus_per_engine), *extra)
        return cls.open(
            model_dir, num_engines=flags.num_engines, engine=flags.engine, engine_args=extra,
            resources={**flags.resources, **(resources or {})}, max_restarts=max_restarts,
            startup_timeout=startup_timeout,
        )

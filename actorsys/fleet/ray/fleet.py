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

The actor's body is :class:`~actorsys.fleet.ray.server.EngineServer`, an engine of the fleet
:class:`~actorsys.fleet.ray.engine.RayEngine`; the driver's calls into Ray are in ``_ray_calls``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any

from actorsys._errors import ConfigError
from actorsys.fleet._proc.serving import new_api_key
from actorsys.fleet.flags import fleet_flags_from_args
from actorsys.fleet.fleet import Fleet
from actorsys.fleet.local.specs import VLLM_PYTHON, EngineSpec, embedded, vllm
from actorsys.fleet.on_all import FleetStartError
from actorsys.fleet.ray._calls import RayCalls, all_answer, import_ray, kill_actors
from actorsys.fleet.ray.engine import ACTOR_ANSWER_TIMEOUT, RayEngine
from actorsys.fleet.ray.server import EngineServer

__all__ = ["DEFAULT_RESOURCES", "ENGINES", "RayFleet", "engine_spec"]

ENGINES = ("embedded", "vllm")
DEFAULT_RESOURCES: Mapping[str, Any] = {"num_cpus": 1}


def engine_spec(engine: str, model_dir: str, engine_args: Sequence[str]) -> EngineSpec:
    """The command, environment and client of one engine of kind ``engine``."""
    if engine == "embedded":
        return embedded(model_dir, extra_args=engine_args)
    if engine == "vllm":
        # Resolved here: the actor runs in a working directory of Ray's.
        return vllm(model_dir, python=os.path.abspath(VLLM_PYTHON), extra_args=engine_args)
    raise ConfigError("RayFleet.open(engine)", f"expected one of {ENGINES}, got {engine!r}")


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
        calls = RayCalls()
        ray = await calls(import_ray, "import ray")

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
                await all_answer(urls)
            except* ray.exceptions.RayError as failed:
                raise FleetStartError(
                    f"an engine actor did not come up: {failed.exceptions[0]}"
                ) from failed
            engines = [RayEngine(a, n, spec, key) for a, n in zip(actors, names, strict=True)]
            yield cls(actors, engines, key)
        finally:
            await calls.shielded(partial(kill_actors, ray, actors), "kill the engine actors",
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

"""RayFleet: inference engines that run as Ray actors (the fleet: :mod:`~actorsys.fleet.ray.fleet`;
the actor's body: :mod:`~actorsys.fleet.ray.server`; the Engine of one actor:
:mod:`~actorsys.fleet.ray.engine`; the driver's calls into Ray: ``_calls``). Ray is imported only
when a fleet is opened."""

from actorsys.fleet.ray._calls import await_ref
from actorsys.fleet.ray.engine import ACTOR_ANSWER_TIMEOUT, RayEngine
from actorsys.fleet.ray.fleet import DEFAULT_RESOURCES, ENGINES, RayFleet, engine_spec
from actorsys.fleet.ray.server import EngineServer

__all__ = [
    "ACTOR_ANSWER_TIMEOUT",
    "DEFAULT_RESOURCES",
    "ENGINES",
    "EngineServer",
    "RayEngine",
    "RayFleet",
    "await_ref",
    "engine_spec",
]

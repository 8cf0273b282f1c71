"""LocalFleet: N engines on loopback, optionally behind sglang-router, started and stopped here
(the launcher: :mod:`~actorsys.fleet.local.fleet`; one engine of it: :mod:`~actorsys.fleet.local.engine`;
starting one of its processes: :mod:`~actorsys.fleet.local.start`; how an engine is started:
:mod:`~actorsys.fleet.local.specs`)."""

from actorsys._errors import FleetStartError
from actorsys.fleet._proc.serving import HEALTH_POLL_INTERVAL, free_port, new_api_key, on_host
from actorsys.fleet.local.engine import LocalEngine
from actorsys.fleet.local.fleet import LocalFleet
from actorsys.fleet.local.specs import VLLM_PYTHON, EngineSpec, embedded, serve_inherited, vllm

__all__ = [
    "HEALTH_POLL_INTERVAL",
    "VLLM_PYTHON",
    "EngineSpec",
    "FleetStartError",
    "LocalEngine",
    "LocalFleet",
    "embedded",
    "free_port",
    "new_api_key",
    "on_host",
    "serve_inherited",
    "vllm",
]

"""Inference fleets: the Engine protocol, Fleet, the engine clients, and local fleets.

- :class:`SGLangEngine`: an sglang server, or the embedded CPU engine
  (``python -m actorsys engine``), which speaks the same API subset.
- :class:`VLLMEngine`: a vLLM OpenAI server with its weight-update endpoints.
- :class:`~actorsys.fleet.local.LocalFleet`: engines (and sglang-router) started on loopback,
  each as an :class:`~actorsys.fleet.local.EngineSpec` says (:func:`~actorsys.fleet.local.embedded`,
  :func:`~actorsys.fleet.local.vllm`).
- :mod:`actorsys.fleet.pin.probe`: the weight probe every pin runs after the version reads back,
  and :mod:`actorsys.fleet.pin.verdict`: its verdict, which may come after the pin returned.
- :class:`~actorsys.fleet.external.ExternalServer`: a server outside the pipeline's fleets
  (attached or launched) as a Fleet of one engine.
- :class:`~actorsys.fleet.ray.RayFleet`: engines as Ray actors (the ``ray`` extra; imported
  only from ``actorsys.fleet.ray``, so this package never needs Ray).
"""

from actorsys.fleet.clients.completions import (
    BadRequestError,
    Completion,
    CompletionError,
    StaleWeightsError,
)
from actorsys.fleet.clients.sglang import SGLangEngine
from actorsys.fleet.clients.vllm import VLLMEngine
from actorsys.fleet.flags import FleetFlags
from actorsys.fleet.fleet import (
    CheckpointRejectedError,
    Engine,
    EngineUnhealthyError,
    Fleet,
    PinError,
    PinViolationError,
)
from actorsys.fleet.on_all import EngineUnauthorizedError
from actorsys.fleet.pin.probe import WeightsMismatchError
from actorsys.fleet.pin.probe.agreement import EnginesDisagreeError
from actorsys.fleet.pin.verdict import PinVerdict, ProbeCancelledError

__all__ = [
    "BadRequestError",
    "CheckpointRejectedError",
    "Completion",
    "CompletionError",
    "Engine",
    "EngineUnauthorizedError",
    "EngineUnhealthyError",
    "EnginesDisagreeError",
    "Fleet",
    "FleetFlags",
    "PinError",
    "PinVerdict",
    "PinViolationError",
    "ProbeCancelledError",
    "SGLangEngine",
    "StaleWeightsError",
    "VLLMEngine",
    "WeightsMismatchError",
]

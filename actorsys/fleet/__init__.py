"""Inference fleets: the Engine protocol, Fleet, the engine clients, and local fleets.

- :class:`SGLangEngine`: an sglang server, or the embedded CPU engine
  (``python -m actorsys engine``), which speaks the same API subset.
- :class:`VLLMEngine`: a vLLM OpenAI server with its weight-update endpoints.
- :class:`~actorsys.fleet.local.LocalFleet`: engines (and sglang-router) started on loopback,
  each as an :class:`~actorsys.fleet.specs.EngineSpec` says (:func:`~actorsys.fleet.specs.embedded`,
  :func:`~actorsys.fleet.specs.vllm`).
- :mod:`actorsys.fleet.probe`: the weight probe every pin runs after the version reads back,
  and :mod:`actorsys.fleet.verdict`: its verdict, which may come after the pin returned.
- :class:`~actorsys.fleet.external.ExternalServer`: a server outside the pipeline's fleets
  (attached or launched) as a Fleet of one engine.
- :class:`~actorsys.fleet.ray.RayFleet`: engines as Ray actors (the ``ray`` extra; imported
  only from ``actorsys.fleet.ray``, so this package never needs Ray).
"""

from actorsys.fleet.completions import (
    BadRequestError,
    Completion,
    CompletionError,
    StaleWeightsError,
)
from actorsys.fleet.engine import (
    CheckpointRejectedError,
    Engine,
    EngineUnhealthyError,
    Fleet,
    PinError,
    PinViolationError,
)
from actorsys.fleet.errors import EngineUnauthorizedError
from actorsys.fleet.flags import FleetFlags
from actorsys.fleet.probe import WeightsMismatchError
from actorsys.fleet.sglang import SGLangEngine
from actorsys.fleet.verdict import PinVerdict, ProbeCancelledError
from actorsys.fleet.vllm import VLLMEngine

__all__ = [
    "BadRequestError",
    "CheckpointRejectedError",
    "Completion",
    "CompletionError",
    "Engine",
    "EngineUnauthorizedError",
    "EngineUnhealthyError",
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

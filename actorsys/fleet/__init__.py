"""Inference fleets: the Engine protocol, Fleet, and the engine clients."""

from actorsys.fleet.engine import (
    Engine,
    EngineUnhealthyError,
    Fleet,
    PinError,
    PinViolationError,
)

__all__ = ["Engine", "EngineUnhealthyError", "Fleet", "PinError", "PinViolationError"]

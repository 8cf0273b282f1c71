"""The record of one submitted point as it moves through the pipeline."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from actorsys.contracts import RolloutFnEvalOutput
from actorsys.fleet import Fleet
from actorsys.snapshot import CapturedWeights

ExportFn = Callable[[int, str], Awaitable[None]]


class Source(enum.Enum):
    WEIGHTS = "weights"
    EXPORT = "export"
    CHECKPOINT = "checkpoint"


class Stage(enum.Enum):
    EXPORT = "export"
    PIN = "pin"
    EVAL = "eval"
    SETTLE = "settle"
    SETTLED = "settled"


@dataclass(eq=False)
class Point:
    """Mutable pipeline state of one step. Owned by exactly one place at a time: a channel
    buffer, or the actor that ``holds`` it (``holder``, with ``scope`` to cancel its work)."""

    step: int
    source: Source
    force: bool = False
    weights: CapturedWeights | None = None
    export: ExportFn | None = None
    checkpoint: str | None = None
    require_marker: bool = False
    stage: Stage = Stage.EXPORT
    pin_started: bool = False
    snapshot: str | None = None
    owned: bool = False
    fleet: Fleet | None = None
    fleet_leased: bool = False
    weight_version: str | None = None
    output: RolloutFnEvalOutput | None = None
    drop_reason: str | None = None
    error: str | None = None
    holder: str | None = None
    scope: trio.CancelScope | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def release_weights(self) -> None:
        """Let go of the captured weights: their buffers return to the pool as soon as no
        export thread reads them any more."""
        if self.weights is not None:
            self.weights.release()
            self.weights = None

    @property
    def supersedable(self) -> bool:
        """A queued point the ``latest`` policy may drop: not forced, not yet pinning."""
        return (
            not self.force
            and not self.pin_started
            and self.drop_reason is None
            and self.stage in (Stage.EXPORT, Stage.PIN)
        )

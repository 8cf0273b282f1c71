"""A point: the frozen message the actors pass along, and the one mutable record of it.

A :class:`Point` never changes: each actor forwards a new one (``dataclasses.replace``) with
what its stage added. The :class:`Ticket` of a point, held by the :class:`~actorsys.actors.flight.Flight`,
says where the point is now (one :class:`State`), which actor owns it, and whether it was
dropped; only the owning actor moves it on.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from actorsys.contracts import RolloutFnEvalOutput
from actorsys.fleet import Fleet
from actorsys.fleet.pin.verdict import PinVerdict
from actorsys.snapshot import CapturedWeights

ExportFn = Callable[[int, str], Awaitable[None]]


class Source(enum.Enum):
    WEIGHTS = "weights"
    EXPORT = "export"
    CHECKPOINT = "checkpoint"
    SERVED = "served"
    """The weights a shared fleet serves now (``submit(step, served=...)``): no copy, no
    export, no snapshot; the point carries its ``weight_version`` from admission."""


class State(enum.Enum):
    """Where a point is. Every point goes forward through these, possibly skipping to SETTLE."""

    EXPORT = "export"
    """With the Exporter: waiting for its turn, or being written."""
    PIN = "pin"
    """With the FleetPinner, waiting for its turn or for an idle fleet."""
    PINNING = "pinning"
    """The FleetPinner leased it a fleet and pins it; no longer supersedable."""
    EVAL = "eval"
    """With the EvalRunner, on a pinned fleet."""
    SETTLE = "settle"
    """On its way to the Retirer."""
    SETTLED = "settled"
    """Its outcome is recorded; its files may still be being deleted (it holds its slot)."""


@dataclass(frozen=True)
class Point:
    """One step on its way through the pipeline, as one actor hands it to the next."""

    step: int
    source: Source
    force: bool = False
    weights: CapturedWeights | None = None
    export: ExportFn | None = None
    checkpoint: str | None = None
    require_marker: bool = False
    snapshot: str | None = None
    scratch: str | None = None
    lease: FleetLease | None = None
    weight_version: str | None = None
    output: RolloutFnEvalOutput | None = None
    reason: str | None = None
    error: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)

    @property
    def files(self) -> list[str]:
        """What actorsys wrote for this point and must delete unless the ring keeps it: the
        snapshot it published, or the tmp dir of an export that did not finish."""
        owned = [self.snapshot] if self.owned and self.snapshot is not None else []
        return owned + ([self.scratch] if self.scratch is not None else [])

    @property
    def owned(self) -> bool:
        """The snapshot was written by actorsys (so it is retired); a given checkpoint never is."""
        return self.snapshot is not None and self.source is not Source.CHECKPOINT

    @property
    def borrowed(self) -> bool:
        """It evaluates a checkpoint of the trainer's (``checkpoint_dir``, reuse mode), which
        the trainer's own rotation must keep until the point settles."""
        return self.source is Source.CHECKPOINT

    def but(self, **changes: object) -> Point:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def timed(self, metric: str, seconds: float) -> Point:
        return self.but(metrics={**self.metrics, metric: seconds})

    def skipped(self, reason: str, error: str | None) -> Point:
        return self.but(reason=reason, error=error, output=None)


@dataclass(frozen=True)
class FleetLease:
    """A fleet the FleetPinner lent to a point (``None``: no fleet, the eval fn brings its own).

    Whoever holds the point holds the lease, and gives the fleet back to the pinner. Once
    pinned, ``verdict`` is the weight probe's verdict on the pin, which may settle after the
    evaluation started: the point's scores count only once it is clean."""

    fleet: Fleet | None
    verdict: PinVerdict | None = None


class Owner(Protocol):
    """An actor that can own points: told at once when one of its points is dropped."""

    name: str

    def dropped(self, ticket: Ticket) -> None: ...


class Ticket:
    """The record of one point in flight: its state, its owner, and a drop waiting for it.

    The owner writes ``state`` and ``point`` as it takes and forwards the point; anyone may
    ``drop`` it, which only tells the owner (it cancels its work or forwards a waiting point).
    """

    def __init__(self, point: Point) -> None:
        self.step = point.step
        self.force = point.force
        self.point = point
        self.state = State.EXPORT
        self.owner: Owner | None = None
        self.drop_reason: tuple[str, str | None] | None = None

    @property
    def supersedable(self) -> bool:
        """A queued point the ``latest`` policy may drop: not forced, not yet pinning."""
        return (
            not self.force
            and self.drop_reason is None
            and self.state in (State.EXPORT, State.PIN)
        )

    def drop(self, reason: str, error: str | None = None) -> bool:
        """Take the point out from outside: its owner forwards it to the Retirer. False if it
        is already on its way there."""
        if self.drop_reason is not None or self.state in (State.SETTLE, State.SETTLED):
            return False
        self.drop_reason = (reason, error)
        if self.owner is not None:
            self.owner.dropped(self)
        return True

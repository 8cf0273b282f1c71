"""What a point settles as, and the reports of drain and close."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["ok", "skipped"]

SKIP_REASONS: tuple[str, ...] = (
    "busy",
    "superseded",
    "disk_budget",
    "export_failed",
    "export_timeout",
    "ckpt_missing",
    "ckpt_invalid",
    "unhealthy",
    "bad_request",
    "pin_violation",
    "pin_timeout",
    "timeout",
    "crashed",
    "closed",
    "preempted",
)
"""The reasons actorsys itself gives; an eval fn may add its own through ``EvalSkip``."""

METRIC_PREFIX = "eval/"
"""Every metric an outcome carries is named ``eval/...``."""
LAG_STEPS = "eval/lag_steps"
DURATION_SECONDS = "eval/duration_seconds"
EXPORT_TIME_SECONDS = "eval/export_time_seconds"
PIN_TIME_SECONDS = "eval/pin_time_seconds"
PIPELINE_METRICS: tuple[str, ...] = (LAG_STEPS, DURATION_SECONDS, EXPORT_TIME_SECONDS, PIN_TIME_SECONDS)
"""The metrics the pipeline itself adds to every point (the eval fn adds the scores)."""


@dataclass(frozen=True)
class Outcome:
    """How one submitted point settled. Every point settles exactly once.

    ``status`` is ``"ok"`` or ``"skipped"`` (then ``reason`` says why; ``data["error"]`` holds
    the error text where there was one). ``weight_version`` is the version the fleet was pinned
    to when the score was taken; ``snapshot`` the checkpoint directory evaluated.
    """

    step: int
    status: Status
    reason: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    data: Any = None
    weight_version: str | None = None
    snapshot: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class BestPoint:
    """One of the best ok points by ``EvalConfig.best_metric`` (``EvalSupervisor.best()``).

    ``value`` is its ``best_metric``; ``snapshot`` the checkpoint kept for it: our snapshot
    under ``hf_dir`` (kept beside the ring, left on close), the trainer's own checkpoint in
    reuse mode or for ``checkpoint_dir`` (never deleted by actorsys), or None where there is
    none to keep (``keep_best=0``, or a point evaluated on the trainer's engines as served).
    """

    step: int
    value: float
    snapshot: str | None


@dataclass(frozen=True)
class DrainReport:
    """``settled``: the steps in flight at the call that settled before it returned;
    ``pending``: those still in flight when its budget ran out."""

    settled: list[int]
    pending: list[int]


@dataclass(frozen=True)
class CloseReport:
    """``clean``: nothing was cut off and no thread was left behind. ``abandoned``: steps that
    settled ``closed``. ``stuck_threads``: worker threads still running when close returned."""

    clean: bool
    abandoned: list[int]
    stuck_threads: list[str]


@dataclass(frozen=True)
class PoolStatistics:
    """The weight buffer pool's statistics (``BufferPool.statistics()``). ``sets``: buffer
    sets alive or promised to a lease; ``free``: of those, idle and faulted in; ``leases``:
    leases granted so far; ``allocations``: sets a copy had to allocate itself (a lease that
    reuses or takes a prepared set allocates nothing); ``prepared``: sets allocated and
    faulted in ahead of any copy; ``preparing``: preparations under way; ``free_nbytes``:
    bytes held by idle sets; ``kept``: frozen bases kept across points (a peft model's, 0 or
    1, one more than ``max_sets``), ``kept_nbytes`` their bytes and ``kept_copied_nbytes`` the
    bytes copied into them so far (the base once, then only what changed in place)."""

    sets: int
    free: int
    leases: int
    allocations: int
    free_nbytes: int
    prepared: int = 0
    preparing: int = 0
    kept: int = 0
    kept_nbytes: int = 0
    kept_copied_nbytes: int = 0


@dataclass(frozen=True)
class SupervisorStatistics:
    in_flight: int
    settled: int
    ok: int
    skipped_by_reason: dict[str, int]
    restarts: int
    gave_up: bool
    closed: bool
    buffers: PoolStatistics | None = None
    weight_update_waits: int = 0
    """How many ``weight_update`` entries found ``served`` points in flight to wait for."""
    weight_update_wait_seconds: float = 0.0
    """The seconds those entries waited, in all."""
    """The weight buffer pool's statistics (sets faulted in, reused, prepared)."""

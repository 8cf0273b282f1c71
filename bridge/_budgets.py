"""The bridge's time budgets: splitting them between the trio side and the hand-back, and
whether leaving a block spends one on draining."""

from __future__ import annotations

MARGIN_FRACTION = 0.05
MARGIN_MAX = 0.25


def trio_share(budget: float) -> float:
    """The part of a host budget the trio side may spend; the rest carries the answer back."""
    return max(0.0, budget - min(budget * MARGIN_FRACTION, MARGIN_MAX))


def drains_on_exit(exc: BaseException | None) -> bool:
    """Whether leaving a bridge's block lets the points in flight finish first: yes on a
    normal exit or an error; no when the host is being stopped (KeyboardInterrupt,
    SystemExit, task cancellation), which cuts them off at once."""
    return exc is None or isinstance(exc, Exception)

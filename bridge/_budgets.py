"""The bridge's time budgets: checking them, splitting them between the trio side and the
hand-back, and whether leaving a block spends one on draining."""

from __future__ import annotations

import math

from actorsys._errors import ConfigError

MARGIN_FRACTION = 0.05
MARGIN_MAX = 0.25


def trio_share(budget: float) -> float:
    """The part of a host budget the trio side may spend; the rest carries the answer back."""
    return max(0.0, budget - min(budget * MARGIN_FRACTION, MARGIN_MAX))


def check_seconds(name: str, value: object, *, optional: bool) -> None:
    """Raise :class:`~actorsys.ConfigError` unless ``value`` is a finite number of seconds
    >= 0 (or None, if ``optional``)."""
    if value is None and optional:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        allowed = "a number of seconds >= 0" + (" or None" if optional else "")
        raise ConfigError(name, f"expected {allowed}, got {value!r}")


def drains_on_exit(exc: BaseException | None) -> bool:
    """Whether leaving a bridge's block lets the points in flight finish first: yes on a
    normal exit or an error; no when the host is being stopped (KeyboardInterrupt,
    SystemExit, task cancellation), which cuts them off at once."""
    return exc is None or isinstance(exc, Exception)

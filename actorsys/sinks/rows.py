"""How a settled point becomes a logged row: the one place that names ``eval/step``, encodes a
skipped point, and defines W&B metrics against ``eval/step``.

A row (:func:`log_row`) holds the point's finite numeric metrics, ``eval/step`` (the step its
weights came from) and, for a skipped point, ``eval/skipped_<reason>`` = 1 (a count a scalar
logger can plot and sum). A logger that also holds text gets the reason as ``eval/skip_reason``
(:func:`skip_reason`). TensorBoard writes the row at the point's step; W&B and the trainers'
loggers log it against ``eval/step`` (a trainer's own step only grows, so a point that lands
after later training steps were logged would be dropped at its step).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from actorsys.outcome import METRIC_PREFIX, Outcome

EVAL_STEP = "eval/step"
"""The axis every eval metric is logged against: the step the evaluated weights came from."""
SKIP_REASON = "eval/skip_reason"
"""The text of a skipped point's reason, for loggers that hold text."""
SKIPPED = "eval/skipped_{reason}"
"""A skipped point's count (1) under its reason."""


def scalar_metrics(outcome: Outcome) -> dict[str, float]:
    """The finite numeric metrics of ``outcome`` (what a scalar logger can plot)."""
    scalars: dict[str, float] = {}
    for name, value in outcome.metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            scalars[name] = float(value)
    return scalars


def skip_reason(outcome: Outcome) -> str | None:
    """Why ``outcome`` was skipped (``unknown`` if it does not say); None for an ok point."""
    return None if outcome.ok else outcome.reason or "unknown"


def log_row(outcome: Outcome) -> dict[str, float]:
    """The row a logger records for one settled point: its numeric metrics and ``eval/step``;
    a skipped point has ``eval/skipped_<reason>`` = 1."""
    row = scalar_metrics(outcome)
    reason = skip_reason(outcome)
    if reason is not None:
        row[SKIPPED.format(reason=reason)] = 1.0
    row[EVAL_STEP] = float(outcome.step)
    return row


class WandbEvalAxis:
    """Logs rows into a W&B run with every metric against ``eval/step``.

    Each name is defined by name the first time a run sees it (``eval/step`` as an axis of its
    own, every other name with ``step_metric="eval/step"``): a name outranks any glob, such as
    the ``*`` a trainer's W&B integration defines against its own step. :meth:`claim_prefix`
    also defines ``eval/*`` against ``eval/step``, for a run of our own.
    """

    def __init__(self) -> None:
        self._run: Any = None
        self._defined: set[str] = set()

    def claim_prefix(self, run: Any) -> None:
        self._define(run, [EVAL_STEP])
        run.define_metric(f"{METRIC_PREFIX}*", step_metric=EVAL_STEP)

    def log(self, run: Any, row: Mapping[str, float | str]) -> None:
        """Define the names of ``row`` new to ``run``, then ``run.log(row)``."""
        self._define(run, row)
        run.log(dict(row))

    def _define(self, run: Any, names: Any) -> None:
        if run is not self._run:
            self._run, self._defined = run, set()
        for name in names:
            if name in self._defined:
                continue
            if name == EVAL_STEP:
                run.define_metric(EVAL_STEP)
            else:
                run.define_metric(name, step_metric=EVAL_STEP)
            self._defined.add(name)

"""Reading a metrics file: one JSON object a line, as ``JsonlSink`` and ``watch`` write it.

A line that is not a metrics record (the torn last line of a run that was killed, another
JSON value, JSON nested too deeply to parse) is skipped with a warning naming the file and the
line, never fatal.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from actorsys._jsonl import read_lines
from actorsys.outcome import PIPELINE_METRICS

log = logging.getLogger("actorsys.cli")


@dataclass(frozen=True)
class Point:
    """One line of a metrics file: an attempt at evaluating ``step``."""

    step: int
    status: str
    reason: str | None
    metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def read_points(path: str | os.PathLike[str]) -> list[Point]:
    """Every point of the file at ``path``, in file order. Blocking."""
    points: list[Point] = []
    for line in read_lines(path):
        try:
            if line.row is None:
                raise ValueError(line.problem)
            points.append(_point(line.row))
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
            log.warning("%s line %d is not a metrics record (%s); skipped", path, line.number, exc)
    return points


def last_of_each_step(points: Sequence[Point]) -> list[Point]:
    """The last point of each step in ``points`` (file order), by step. A file may hold a step
    twice: a supervisor that resumes after a crash evaluates again a point whose outcome
    reached the sink just before the crash, and a trainer resumed from an earlier checkpoint
    submits its steps again; the later line is the one that stands."""
    last = {point.step: point for point in points}
    return [last[step] for step in sorted(last)]


def _point(row: dict[str, Any]) -> Point:
    metrics = {
        k: float(v)
        for k, v in (row.get("metrics") or {}).items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    return Point(
        step=int(row["step"]),
        status=str(row["status"]),
        reason=None if row.get("reason") is None else str(row["reason"]),
        metrics=metrics,
        checkpoint=row.get("checkpoint") or row.get("snapshot"),
    )


def score_metrics(points: Sequence[Point]) -> list[str]:
    """The headline scores in ``points``: ``eval/<name>`` (a dataset's mean score, as the
    evaluations name it); where there are none, every metric but the pipeline's timings and
    the standard errors (which go with their metric: :func:`stderr_name`)."""
    names = sorted({name for p in points for name in p.metrics} - set(PIPELINE_METRICS))
    names = [n for n in names if not n.endswith(STDERR_SUFFIX)]
    headline = [n for n in names if n.count("/") == 1]
    return headline or names


STDERR_SUFFIX = "/stderr"


def stderr_name(metric: str) -> str:
    """The name of ``metric``'s standard error: ``eval/math`` -> ``eval/math/stderr``,
    ``eval/math/pass@4`` -> ``eval/math/pass@4/stderr``."""
    return metric + STDERR_SUFFIX


def read_samples(path: str | os.PathLike[str], step: int) -> dict[str, list[Any]] | None:
    """``data["samples"]`` of the last ok point of ``step`` in the file at ``path`` (a dataset
    name to its sample records, as :class:`~actorsys.evals.DatasetEval` keeps them), or None
    if the file has no ok point of that step. Blocking (reads the file)."""
    found: dict[str, list[Any]] | None = None
    for line in read_lines(path):
        row = line.row
        if not isinstance(row, dict) or row.get("status") != "ok" or row.get("step") != step:
            continue
        data = row.get("data")
        samples = data.get("samples") if isinstance(data, dict) else None
        found = {str(name): list(records) for name, records in samples.items()
                 if isinstance(records, list)} if isinstance(samples, dict) else {}
    return found

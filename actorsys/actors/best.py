"""What the Retirer decides from each ok point's number: the best points, and whether to stop.

:class:`BestKeeper` ranks the ok points by ``EvalConfig.best_metric`` (higher is better for
``best_mode="max"``, lower for ``"min"``; a tie keeps the earlier step first) and keeps the
``keep_best`` best. The Retirer offers it every outcome as it settles, before the sink sees
it, so that whoever reads ``best()`` or ``should_stop`` on seeing an outcome sees that
outcome counted. An offer is sync, quick and touches no file: it returns a :class:`Change`,
the snapshots that left the best (ours only: the Retirer retires them unless its ring still
keeps them) and the new contents of ``hf_dir/best.json``, which the Retirer's delete thread
writes with :func:`write_record` *before* it retires what was displaced, so ``best.json``
never names a directory already gone.

A point without ``best_metric`` (or with a value that is not a finite number) is no
candidate and leaves patience alone: it did not measure what ranks the points. A point
evaluated as served (``Outcome.snapshot`` None) or with ``keep_best=0`` ranks with snapshot
None: there is nothing to keep for it. The trainer's own checkpoints (reuse mode,
``checkpoint_dir``) are named as they are and never deleted.

Stopping: ``stop_when`` holds at the first ok point that reaches every threshold of the
mapping (``>=`` for ``"max"``, ``<=`` for ``"min"``); ``patience`` after that many ok points
in a row whose ``best_metric`` does not beat the best value so far. Once either holds,
``should_stop`` stays True and ``stop_reason`` says why.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass

from actorsys._files import replace_file
from actorsys.config import EvalConfig
from actorsys.outcome import BestPoint, Outcome

log = logging.getLogger("actorsys")

BEST_JSON = "best.json"


@dataclass(frozen=True)
class Change:
    displaced: tuple[str, ...] = ()
    """Our snapshots no longer among the best."""
    record: bytes | None = None
    """The new ``best.json``; None: unchanged (or there is no ``hf_dir`` to write it in)."""


NO_CHANGE = Change()


class BestKeeper:
    """The best points so far and the stop signal. Not thread-safe by itself: only the
    Retirer's trio thread calls :meth:`offer`; readers elsewhere read :attr:`points` and
    :attr:`stop_reason`, each replaced whole (never mutated), so a read sees one state."""

    def __init__(self, config: EvalConfig, staging_dir: str | None) -> None:
        self.metric = config.best_metric
        self.lower = config.best_mode == "min"
        self.keeps = config.keep_best > 0
        self.size = 0 if self.metric is None else max(config.keep_best, 1)
        self.stop_when = dict(config.stop_when or {})
        self.patience = config.patience
        self.path = (
            None if staging_dir is None or self.metric is None
            else os.path.join(staging_dir, BEST_JSON)
        )
        self.points: tuple[BestPoint, ...] = ()
        self.kept: frozenset[str] = frozenset()
        """Our snapshots the best keep (the Retirer deletes none of them)."""
        self.protected: frozenset[int] = frozenset()
        """The steps whose checkpoints are kept as best (a trainer's rotation keeps them)."""
        self.stop_reason: str | None = None
        self._best_value: float | None = None
        self._stale = 0
        self._told_missing = False

    @property
    def should_stop(self) -> bool:
        return self.stop_reason is not None

    def offer(self, outcome: Outcome, *, owned: bool) -> Change:
        """Count the settled ``outcome``; ``owned``: its snapshot is ours to retire."""
        if not outcome.ok:
            return NO_CHANGE
        self._check_thresholds(outcome)
        value = _number(outcome.metrics, self.metric)
        if value is None:
            if self.metric is not None and not self._told_missing:
                self._told_missing = True
                log.warning("best_metric %r is not a number among the metrics of step %d (%s); "
                            "such points do not rank", self.metric, outcome.step,
                            ", ".join(sorted(outcome.metrics)) or "none")
            return NO_CHANGE
        self._check_patience(outcome.step, value)
        return self._rank(outcome, value, owned)

    def _better(self, value: float, than: float) -> bool:
        return value < than if self.lower else value > than

    def _rank(self, outcome: Outcome, value: float, owned: bool) -> Change:
        snapshot = outcome.snapshot if self.keeps else None
        new = BestPoint(step=outcome.step, value=value, snapshot=snapshot)
        points = [*self.points, new]
        # Stable: of equal values the earlier step stays first.
        points.sort(key=lambda p: (p.value if self.lower else -p.value, p.step))
        kept, dropped = points[: self.size], points[self.size :]
        if new in dropped:
            return NO_CHANGE
        ours = set(self.kept)
        if owned and snapshot is not None:
            ours.add(snapshot)
        displaced = tuple(p.snapshot for p in dropped if p.snapshot in ours)
        self.kept = frozenset(ours - set(displaced))
        self.points = tuple(kept)
        self.protected = frozenset(p.step for p in kept) if self.keeps else frozenset()
        return Change(displaced=displaced, record=None if self.path is None else self.record())

    def record(self) -> bytes:
        """``best.json``: ``[{step, value, path}, ...]``, best first."""
        rows = [{"step": p.step, "value": p.value, "path": p.snapshot} for p in self.points]
        return (json.dumps(rows, indent=1) + "\n").encode()

    def _check_thresholds(self, outcome: Outcome) -> None:
        if self.stop_reason is not None or not self.stop_when:
            return
        reached = []
        for metric, threshold in self.stop_when.items():
            value = _number(outcome.metrics, metric)
            if value is None or self._better(threshold, value):
                return
            reached.append(f"{metric} = {value:g} {'<=' if self.lower else '>='} {threshold:g}")
        self.stop_reason = f"step {outcome.step} reached {', '.join(reached)}"

    def _check_patience(self, step: int, value: float) -> None:
        if self._best_value is None or self._better(value, self._best_value):
            self._best_value, self._stale = value, 0
            return
        self._stale += 1
        if self.patience is not None and self._stale >= self.patience and self.stop_reason is None:
            self.stop_reason = (
                f"{self.metric} has not beaten {self._best_value:g} for {self._stale} points "
                f"in a row (patience {self.patience}, last at step {step})"
            )


def _number(metrics: dict[str, float], name: str | None) -> float | None:
    value = None if name is None else metrics.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def write_record(path: str, record: bytes) -> None:
    """Replace ``path`` with ``record`` atomically (:func:`~actorsys._files.replace_file`): a
    reader sees the old file or the new, never part. Blocking (the Retirer runs it in its
    delete thread)."""
    replace_file(path, record)

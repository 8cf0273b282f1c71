"""How the answers of one dataset are graded in the scoring workers: the dataset's scorer, or
a record's own ``rm_type`` (in its metadata, as in miles), with what a scorer needs besides the
answer and the label (the record, its metadata, the prompt the model was given, the reward
server of ``remote_rm``).

:class:`Grader` travels to the workers once per chunk of answers, and each answer travels with
its :func:`grading_input`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from actorsys.evals.scoring import miles_rewards
from actorsys.evals.scoring.remote_rm import remote_reward
from actorsys.evals.scoring.scorers import (
    BOXED,
    SCORERS,
    Grading,
    Scorer,
    base_scorer,
    builtin_score,
    is_custom,
    score,
    scorer_name,
)

RM_TYPE = "rm_type"
"""The metadata key of a record's own scorer."""


def record_scorer(default: Scorer, metadata: Mapping[str, Any] | None) -> Scorer:
    """The scorer of one record: its metadata's ``rm_type`` where set, else ``default``; a
    custom ``default`` (a callable, a dotted path: miles' ``--custom-rm-path``) grades every
    record, as in miles."""
    if is_custom(default):
        return default
    own = (metadata or {}).get(RM_TYPE)
    if isinstance(own, str) and own.strip():
        return own.strip()
    return default


def grading_input(record: Mapping[str, Any], metadata: Mapping[str, Any] | None,
                  prompt: str) -> dict[str, Any]:
    """What travels with one answer to :meth:`Grader.grade`."""
    return {"record": record, "metadata": dict(metadata or {}), "prompt": prompt}


@dataclass(frozen=True)
class Grader(Grading):
    """Grades one dataset's answers: each with its record's scorer (:func:`record_scorer`).
    ``rm_url`` and ``timeout`` serve ``remote_rm``; ``math``: some record grades with
    math-verify (its workers import it before the first answer)."""

    scorer: Scorer
    rm_url: str | None = None
    timeout: float = 10.0
    math: bool = False

    @property
    def name(self) -> str:  # type: ignore[override]
        return scorer_name(self.scorer)

    @property
    def needs_math(self) -> bool:
        return self.math

    def grade(self, answer: str, label: Any, record: Mapping[str, Any]) -> float:
        metadata = record.get("metadata") or {}
        scorer = record_scorer(self.scorer, metadata)
        if isinstance(scorer, str) and base_scorer(scorer) == "remote_rm":
            if scorer.startswith(BOXED):
                answer = miles_rewards.last_boxed(answer) or ""
            if not self.rm_url:
                raise ValueError("remote_rm needs the dataset's rm_url (--rm-url)")
            return remote_reward(self.rm_url, prompt=str(record.get("prompt", "")),
                                 response=answer, label=label, metadata=metadata,
                                 timeout=self.timeout)
        if isinstance(scorer, str) and base_scorer(scorer) in SCORERS:
            return builtin_score(scorer, answer, label, metadata)
        return score(scorer, answer, label, record.get("record") or {})

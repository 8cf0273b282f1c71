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


@dataclass(frozen=True)
class RefusedScorer(Grading):
    """What a record's ``rm_type`` that names no built-in scorer grades with: nothing. Every
    answer of that record raises ``ValueError`` (scored 0, counted in
    ``eval/<name>/scorer_errors``), and the name is never imported: datasets come from hubs
    and mixing scripts, and a record must never choose the code that runs on its answer."""

    rm_type: str

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"refused rm_type {self.rm_type[:100]!r}"

    def grade(self, answer: str, label: Any, record: Mapping[str, Any]) -> float:
        raise ValueError(
            f"{RM_TYPE} {self.rm_type[:200]!r} is not a built-in scorer; a record may name "
            f"only {', '.join(SCORERS)} or boxed_<one of them> (a dotted path is taken only "
            "from the configuration: scorer=, --custom-rm-path, an --eval-config file)"
        )


def is_builtin_name(name: str) -> bool:
    """Whether ``name`` is a built-in scorer, with at most one ``boxed_`` prefix."""
    base = base_scorer(name)
    return base in SCORERS and not base.startswith(BOXED)


def record_scorer(default: Scorer, metadata: Mapping[str, Any] | None) -> Scorer:
    """The scorer of one record: its metadata's ``rm_type`` where set, else ``default``; a
    custom ``default`` (a callable, a dotted path: miles' ``--custom-rm-path``) grades every
    record, as in miles. An ``rm_type`` that is no built-in name (:func:`is_builtin_name`) is
    a :class:`RefusedScorer`: that record's answers are scorer errors, never imports."""
    if is_custom(default):
        return default
    own = (metadata or {}).get(RM_TYPE)
    if own is None or (isinstance(own, str) and not own.strip()):
        return default
    if isinstance(own, str) and is_builtin_name(own.strip()):
        return own.strip()
    # a Grading goes wherever a scorer goes (score() calls its grade), as check_scorer's do
    return RefusedScorer(str(own) if isinstance(own, str) else repr(own)[:200])  # type: ignore[return-value]


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

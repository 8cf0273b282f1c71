"""Scorers: how one answer is graded against its label, 1 for correct, 0 for wrong.

- ``"exact"``: the stripped answer equals the stripped label.
- ``"numeric"``: the last number in the answer equals the label numerically (``"1,234.0"`` is
  ``1234``).
- ``"math"``: math-verify parses both sides (LaTeX, ``\\boxed{}``, plain expressions) and
  checks them for mathematical equivalence (``\\frac{1}{2}`` is ``0.5``).
- ``"choice"``: the letter A-J the answer chooses (``\\boxed{C}``, ``answer: (C)``, ``C) ...``)
  equals the label (a letter, or a 0-based index).
- miles' ``--rm-type`` names, with miles' semantics (:mod:`actorsys.evals.scoring.miles_rewards`):
  ``"deepscaler"``, ``"dapo"``, ``"f1"``, ``"gpqa"``; ``"remote_rm"`` (a reward server at a
  dataset's ``rm_url``, :mod:`actorsys.evals.scoring.remote_rm`); and ``"boxed_<scorer>"``: the content
  of the answer's last ``\\boxed{}`` (nothing if it has none) graded by ``<scorer>``.
- a callable ``(answer, label, record) -> float`` in [0, 1], or its dotted path
  ``"pkg.module.fn"`` (miles' ``--custom-rm-path``), imported where it scores.
"""

from __future__ import annotations

import functools
import importlib
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from actorsys._errors import ConfigError
from actorsys.evals.scoring.builtin import (
    BOXED,
    CHOICES,
    EXTRACTING,
    MATH_SCORERS,
    MATH_TIMEOUT_SECONDS,
    SCORERS,
    base_scorer,
    builtin_score,
    choice_index,
    chosen_letter,
    extracted_answer,
    needs_math,
    parse_number,
)

ScorerFn = Callable[[str, Any, Mapping[str, Any]], float]
Scorer = str | ScorerFn

__all__ = [
    "BOXED", "CHOICES", "EXTRACTING", "MATH_SCORERS", "MATH_TIMEOUT_SECONDS", "SCORERS",
    "Grading", "Scorer", "ScorerFn", "base_scorer", "builtin_score", "check_scorer",
    "choice_index", "chosen_letter", "extracted_answer", "is_custom", "load_scorer",
    "needs_math", "parse_number", "score", "scorer_name",
]

_DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")


class Grading:
    """A scorer that brings its own context (a dataset's per-record scorers, its reward
    server): :func:`score` calls its :meth:`grade` with the ``record`` it is given and takes
    the number it returns as it is."""

    name = "grading"

    def grade(self, answer: str, label: Any, record: Mapping[str, Any]) -> float:
        raise NotImplementedError


def check_scorer(scorer: object, *, field: str = "scorer") -> Scorer:
    """``scorer`` as a scorer name, dotted path or callable. Raises :class:`ConfigError`
    naming ``field`` and the allowed values, or the dotted path that does not import."""
    if callable(scorer) or isinstance(scorer, Grading):
        return scorer  # type: ignore[return-value]
    if isinstance(scorer, str):
        base = scorer.removeprefix(BOXED)
        if base in SCORERS and not base.startswith(BOXED):
            return scorer
        if _DOTTED.match(scorer):
            load_scorer(scorer)
            return scorer
    allowed = ", ".join(SCORERS)
    raise ConfigError(
        field,
        f"unknown scorer {scorer!r}; expected one of {allowed}, boxed_<one of them>, a dotted "
        "path pkg.module.fn, or a callable (answer, label, record) -> float in [0, 1]",
    )


@functools.lru_cache(maxsize=64)
def load_scorer(path: str) -> ScorerFn:
    """The function a dotted path ``pkg.module.fn`` names; :class:`ConfigError` naming the
    path where it does not import or is not callable. Imports the module."""
    module_name, _, attribute = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
        function = getattr(module, attribute)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a module that exits at import (SystemExit) is a bad path
        raise ConfigError(
            "custom_rm_path",
            f"the scorer {path!r} does not import: {type(exc).__name__}: {exc}",
        ) from None
    if not callable(function):
        raise ConfigError("custom_rm_path", f"{path!r} is not callable")
    return function


def is_custom(scorer: object) -> bool:
    """Whether ``scorer`` is the user's own: a callable, or a dotted path to one."""
    return callable(scorer) or (isinstance(scorer, str) and _DOTTED.match(scorer) is not None)


def scorer_name(scorer: Scorer) -> str:
    """A stable name for ``scorer``: its name, or the callable's module and qualified name."""
    if isinstance(scorer, str):
        return scorer
    if isinstance(scorer, Grading):
        return scorer.name
    module = getattr(scorer, "__module__", None) or "?"
    return f"{module}.{getattr(scorer, '__qualname__', type(scorer).__qualname__)}"


def score(scorer: Scorer, answer: str, label: Any, record: Mapping[str, Any] | None = None) -> float:
    """Grade ``answer`` against ``label`` with ``scorer`` (a name, dotted path or callable);
    1.0 is correct. ``record`` is the dataset record (a callable gets it; ``gpqa`` reads its
    ``metadata``).

    Raises what the scorer raises, and ``ValueError`` if a callable returns something other
    than a number in [0, 1] (or for ``remote_rm``, which needs a dataset's ``rm_url``); an
    evaluation counts that and scores the sample 0. Blocking and CPU-bound (``"math"`` runs
    sympy, which an answer can send into work that never ends): evaluations call it in worker
    processes (:mod:`actorsys.evals.scoring.pool`).
    """
    if isinstance(scorer, Grading):
        return scorer.grade(answer, label, record if record is not None else {})
    resolved = check_scorer(scorer)
    if isinstance(resolved, str) and _DOTTED.match(resolved):
        resolved = load_scorer(resolved)
    if callable(resolved):
        value = resolved(answer, label, record if record is not None else {})
        if isinstance(value, bool):
            return float(value)
        if not isinstance(value, int | float) or not 0.0 <= value <= 1.0 or math.isnan(value):
            raise ValueError(
                f"scorer {scorer_name(resolved)} returned {value!r}; expected a number in [0, 1]"
            )
        return float(value)
    metadata = record.get("metadata") if isinstance(record, Mapping) else None
    return builtin_score(resolved, answer, label, metadata if isinstance(metadata, Mapping) else None)



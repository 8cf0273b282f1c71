"""What a scoring worker process runs (:mod:`actorsys.evals.scoring.pool` sends the jobs).

Each job is one of these functions, sent by reference: the worker imports this module, the
scorers and what a scorer needs (math-verify, the reward server's client, a user's scorer
module), never torch, transformers or trio. The packages around it (``actorsys``,
``actorsys.evals``) import their public names only when first asked for them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from actorsys.evals.scoring.scorers import (
    Grading,
    Scorer,
    is_custom,
    load_scorer,
    score,
    scorer_name,
)

Item = tuple[str, Any, Mapping[str, Any] | None]
"""One answer to score: its text, its label, its record (None for the built-in scorers)."""


def score_batch(scorer: Scorer, items: Sequence[Item]) -> list[tuple[float, str | None]]:
    """Score every item, catching whatever each scorer raises (``BaseException`` included: a
    scorer's ``sys.exit()`` or ``KeyboardInterrupt`` scores that answer 0 like any other
    error, and the worker scores on)."""
    scored: list[tuple[float, str | None]] = []
    for answer, label, record in items:
        try:
            scored.append((score(scorer, answer, label, record), None))
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt too: a 0
            scored.append((0.0, f"scorer {scorer_name(scorer)} raised {exc!r}"[:1000]))
    return scored


def warm_up(scorers: Sequence[Scorer | Grading]) -> int:
    """Import what ``scorers`` need (unpickling them imports a callable's module; a dotted
    path is loaded, one that fails left to fail each answer) and score a sample with
    math-verify where one grades with it (its parsers load at first use); the worker's pid."""
    for scorer in scorers:
        dotted = getattr(scorer, "scorer", scorer)  # a dataset's Grader holds its default
        if isinstance(dotted, str) and is_custom(dotted):
            with contextlib.suppress(Exception):  # each answer then scores 0 with the error
                load_scorer(dotted)
        if scorer == "math" or getattr(scorer, "needs_math", False):
            score("math", "\\boxed{1}", "1")
    return os.getpid()

"""Scorers: how one answer is graded against its label, 1 for correct, 0 for wrong.

- ``"exact"``: the stripped answer equals the stripped label.
- ``"numeric"``: the last number in the answer equals the label numerically (``"1,234.0"`` is
  ``1234``).
- ``"math"``: math-verify parses both sides (LaTeX, ``\\boxed{}``, plain expressions) and
  checks them for mathematical equivalence (``\\frac{1}{2}`` is ``0.5``).
- ``"choice"``: the letter A-J the answer chooses (``\\boxed{C}``, ``answer: (C)``, ``C) ...``)
  equals the label (a letter, or a 0-based index).
- a callable ``(answer, label, record) -> float`` in [0, 1].

miles' ``--rm-type`` names map onto these: ``deepscaler`` and ``dapo`` grade with ``math``,
``gpqa`` with ``choice``.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from actorsys._errors import ConfigError

ScorerFn = Callable[[str, Any, Mapping[str, Any]], float]
Scorer = str | ScorerFn

SCORERS = ("exact", "numeric", "math", "choice")
MILES_RM_TYPES = {"deepscaler": "math", "dapo": "math", "gpqa": "choice"}
CHOICES = "ABCDEFGHIJ"
MATH_TIMEOUT_SECONDS = 5

_NUMBER = re.compile(r"-?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_CHOICE_PATTERNS = (
    re.compile(r"\\boxed\{\s*\(?([A-J])\)?\s*\}"),
    re.compile(r"answer\s*(?:is|:)?\s*[:\-]?\s*\(?\*{0,2}([A-J])\b", re.IGNORECASE),
    re.compile(r"^\s*\(?([A-J])(?:[).:]|\s*$)"),
    re.compile(r"\(([A-J])\)"),
)


def check_scorer(scorer: object, *, field: str = "scorer") -> Scorer:
    """``scorer`` as a scorer name or callable; a miles ``--rm-type`` alias is translated.
    Raises :class:`ConfigError` naming ``field`` and the allowed values."""
    if callable(scorer):
        return scorer
    if isinstance(scorer, str):
        name = MILES_RM_TYPES.get(scorer, scorer)
        if name in SCORERS:
            return name
    allowed = ", ".join(SCORERS + tuple(MILES_RM_TYPES))
    raise ConfigError(
        field,
        f"unknown scorer {scorer!r}; expected one of {allowed}, "
        "or a callable (answer, label, record) -> float in [0, 1]",
    )


def scorer_name(scorer: Scorer) -> str:
    """A stable name for ``scorer``: its name, or the callable's module and qualified name."""
    if isinstance(scorer, str):
        return scorer
    module = getattr(scorer, "__module__", None) or "?"
    return f"{module}.{getattr(scorer, '__qualname__', type(scorer).__qualname__)}"


def score(scorer: Scorer, answer: str, label: Any, record: Mapping[str, Any] | None = None) -> float:
    """Grade ``answer`` against ``label`` with ``scorer`` (a name or a callable); 1.0 is correct.

    Raises what the scorer raises, and ``ValueError`` if a callable returns something other
    than a number in [0, 1]; an evaluation counts that and scores the sample 0. Blocking and
    CPU-bound (``"math"`` runs sympy, which an answer can send into work that never ends):
    evaluations call it in worker processes (:mod:`actorsys.evals.scoring_pool`).
    """
    resolved = check_scorer(scorer)
    if callable(resolved):
        value = resolved(answer, label, record if record is not None else {})
        if isinstance(value, bool):
            return float(value)
        if not isinstance(value, int | float) or not 0.0 <= value <= 1.0 or math.isnan(value):
            raise ValueError(
                f"scorer {scorer_name(resolved)} returned {value!r}; expected a number in [0, 1]"
            )
        return float(value)
    return _BUILTIN[resolved](answer, label)


def parse_number(text: object) -> float:
    """A label as a finite number (``3``, ``"3.50"``, ``"1,234"``); raises ``ValueError``
    (also for a number beyond a float's range, such as ``1e309`` or a 400-digit integer, and
    for ``inf`` or ``nan``)."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a number")
    try:
        value = float(text) if isinstance(text, int | float) else float(
            str(text).strip().replace(",", ""))
    except OverflowError:
        raise ValueError("a number beyond a float's range (about 1.8e308)") from None
    if not math.isfinite(value):
        raise ValueError("not a finite number")
    return value


def choice_index(label: object) -> int:
    """A choice label (``"C"``, ``"(c)"``, or the 0-based index ``2``) as its index; raises
    ``ValueError``."""
    if isinstance(label, int) and not isinstance(label, bool) and 0 <= label < len(CHOICES):
        return label
    if isinstance(label, str):
        letter = label.strip().strip("()").strip().upper()
        if len(letter) == 1 and letter in CHOICES:
            return CHOICES.index(letter)
    raise ValueError(f"{label!r} is not a choice: expected a letter A-J or an index 0-9")


def chosen_letter(answer: str) -> str | None:
    """The letter A-J that ``answer`` chooses, or None if it names none."""
    for pattern in _CHOICE_PATTERNS:
        match = pattern.search(answer)
        if match:
            return match.group(1).upper()
    return None


def _exact(answer: str, label: Any) -> float:
    return float(answer.strip() == str(label).strip())


def _numeric(answer: str, label: Any) -> float:
    expected = parse_number(label)
    numbers = _NUMBER.findall(answer)
    if not numbers:
        return 0.0
    try:
        got = parse_number(numbers[-1].rstrip("."))
    except ValueError:
        return 0.0
    return float(math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9))


def _choice(answer: str, label: Any) -> float:
    letter = chosen_letter(answer)
    return float(letter is not None and CHOICES.index(letter) == choice_index(label))


def _math(answer: str, label: Any) -> float:
    from math_verify import parse, verify

    # math-verify bounds its own work with SIGALRM, which only the main thread may use (a
    # scoring worker runs it there). Neither bounds a C call that holds the GIL: only killing
    # the worker at score_timeout (evals.scoring_pool) stops that.
    seconds = MATH_TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None
    gold_text = str(label).strip()
    gold = []
    if "$" not in gold_text and "\\boxed" not in gold_text:
        gold = parse(f"${gold_text}$", parsing_timeout=seconds)
    if not gold:
        gold = parse(gold_text, parsing_timeout=seconds)
    if not gold:
        raise ValueError(f"math-verify cannot parse the label {gold_text!r}")
    predicted = parse(answer, parsing_timeout=seconds)
    if not predicted:
        return 0.0
    return float(verify(gold, predicted, timeout_seconds=seconds))


_BUILTIN: dict[str, Callable[[str, Any], float]] = {
    "exact": _exact,
    "numeric": _numeric,
    "math": _math,
    "choice": _choice,
}

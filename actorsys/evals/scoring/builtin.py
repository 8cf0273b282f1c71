"""The built-in scorers, by name: how each grades an answer against its label, and the answer
it extracts (what a majority vote counts). The names and their meanings are listed in
:mod:`actorsys.evals.scoring.scorers`, which resolves every kind of scorer and grades with it.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from actorsys.evals.scoring import miles_rewards

SCORERS = ("exact", "numeric", "math", "choice", "deepscaler", "dapo", "f1", "gpqa", "remote_rm")
BOXED = "boxed_"
"""The prefix of a scorer that grades only the content of the answer's last ``\\boxed{}``."""
MATH_SCORERS = frozenset({"math", "deepscaler"})
"""The scorers that need math-verify."""
EXTRACTING = frozenset({"numeric", "math", "choice", "deepscaler", "dapo", "gpqa"})
"""The scorers that grade one answer they extract (so a majority vote over samples is
defined: ``maj@n``)."""
CHOICES = "ABCDEFGHIJ"
MATH_TIMEOUT_SECONDS = 5

_NUMBER = re.compile(r"-?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_CHOICE_PATTERNS = (
    re.compile(r"\\boxed\{\s*\(?([A-J])\)?\s*\}"),
    re.compile(r"answer\s*(?:is|:)?\s*[:\-]?\s*\(?\*{0,2}([A-J])\b", re.IGNORECASE),
    re.compile(r"^\s*\(?([A-J])(?:[).:]|\s*$)"),
    re.compile(r"\(([A-J])\)"),
)


def base_scorer(scorer: str) -> str:
    """A scorer name without its ``boxed_`` prefix."""
    return scorer.removeprefix(BOXED)


def needs_math(scorer: object) -> bool:
    """Whether ``scorer`` grades with math-verify."""
    return isinstance(scorer, str) and base_scorer(scorer) in MATH_SCORERS


def extracted_answer(
    scorer: object, answer: str, metadata: Mapping[str, Any] | None = None
) -> str | None:
    """The answer ``scorer`` grades, as text (what a majority vote counts); None where it
    finds none, or where ``scorer`` grades no single extracted answer."""
    if not isinstance(scorer, str) or base_scorer(scorer) not in EXTRACTING:
        return None
    if scorer.startswith(BOXED):
        answer = miles_rewards.last_boxed(answer) or ""
    name = base_scorer(scorer)
    found: str | None
    if name == "deepscaler":
        found = miles_rewards.deepscaler_answer(answer)
    elif name == "dapo":
        found = miles_rewards.dapo_answer(answer)
    elif name == "gpqa":
        found = miles_rewards.gpqa_answer(answer, miles_rewards.gpqa_letters(metadata))
    elif name == "choice":
        found = chosen_letter(answer)
    elif name == "math":
        found = miles_rewards.last_boxed(answer)
        if found is None:
            numbers = _NUMBER.findall(answer)
            found = numbers[-1].rstrip(".") if numbers else None
    else:
        numbers = _NUMBER.findall(answer)
        found = numbers[-1].rstrip(".").replace(",", "") if numbers else None
    if found is None:
        return None
    found = " ".join(found.split())
    return found or None


def builtin_score(
    scorer: str, answer: str, label: Any, metadata: Mapping[str, Any] | None = None
) -> float:
    """A built-in scorer (``boxed_`` prefix included) on ``answer``; ``metadata`` is the
    record's (for ``gpqa``)."""
    if scorer.startswith(BOXED):
        answer = miles_rewards.last_boxed(answer) or ""
        scorer = base_scorer(scorer)
    if scorer == "remote_rm":
        raise ValueError("remote_rm scores through a reward server: set the dataset's rm_url")
    if scorer == "gpqa":
        return miles_rewards.gpqa(answer, label, metadata)
    return _BUILTIN[scorer](answer, label)


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


def _deepscaler(answer: str, label: Any) -> float:
    return miles_rewards.deepscaler(answer, label, _equivalent)


def _equivalent(given: str, gold: str) -> bool:
    """Math equivalence of an extracted answer and a label (math-verify)."""
    return _math(f"\\boxed{{{given}}}", gold) == 1.0


_BUILTIN: dict[str, Callable[[str, Any], float]] = {
    "exact": _exact,
    "numeric": _numeric,
    "math": _math,
    "choice": _choice,
    "deepscaler": _deepscaler,
    "dapo": miles_rewards.dapo,
    "f1": miles_rewards.f1,
}

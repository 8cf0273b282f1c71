"""miles' rule-based reward types, with miles' semantics (what its ``rm_hub`` scores), so a
curve reported here is the curve miles reports for the same checkpoints.

- ``deepscaler``: only the text after the last ``</think>`` (or after ``###Response``) is
  graded; an answer with neither marker scores 0 (a reasoning model graded over its thinking
  would be credited for an answer it only considered). Its last ``\\boxed{...}`` is compared
  with the label (itself unboxed if boxed) by math equivalence; no box scores 0.
- ``dapo``: the last ``Answer: X`` line among the answer's last 300 characters, normalized as
  Minerva does (units, ``\\text{}``, ``$``, ``\\boxed{}`` removed), must equal the label read as
  an integer (DAPO's answers are integers); no such line scores 0.
- ``f1``: token F1 after lowercasing and removing punctuation and the articles a, an, the; a
  ``yes``/``no``/``noanswer`` on either side must match exactly.
- ``gpqa``: the option letter the answer picks (after its thinking) against the label: a
  letter, the index of the right choice, or the text of a choice in the record's metadata
  ``choices``; an answer that names no letter but contains the right choice's text scores 1.
- :func:`last_boxed`: the content of the last ``\\boxed{...}`` (the ``boxed_`` prefix).

Blocking and CPU-bound; they run in the scoring workers (:mod:`actorsys.evals.scoring.pool`).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

THINK_END = "</think>"
RESPONSE_MARKER = "###Response"
DAPO_TAIL_CHARS = 300
"""dapo reads only the answer's end (the longest MATH-500 answer has 159 characters)."""
GPQA_LETTERS = tuple("ABCDEFGH")
"""gpqa's options when the record names none: A-H, as miles (a wider range would read the
word "I" as a choice)."""

_BOXED = "\\boxed"
_DAPO_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_MINERVA_SUBSTITUTIONS = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)
_MINERVA_REMOVED = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots",
    "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds",
    "meters", "meals", "edges", "students", "childrentickets", "multiples", "\\text{s}",
    "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}",
    "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots", "<|im_end|>",
    "<|endoftext|>",
)
_GPQA_PATTERNS = (
    re.compile(r"(?:answer|option|choice)\s*(?:is|:)?\s*([A-Z])", re.IGNORECASE),
    re.compile(r"([A-Z])\s*(?:is\s*(?:the)?\s*correct)", re.IGNORECASE),
    re.compile(r"final\s*(?:answer|option)\s*(?:is|:)?\s*([A-Z])", re.IGNORECASE),
)
_YES_NO = ("yes", "no", "noanswer")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text``, braces balanced; None where the
    last ``\\boxed`` is not followed by a closed ``{...}`` (``\\boxed 4`` is none)."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    opening = start + len(_BOXED)
    if text[opening : opening + 1] != "{":
        return None
    depth = 0
    for index in range(opening, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[opening + 1 : index]
    return None


def after_thinking(answer: str) -> str | None:
    """What deepscaler grades: the text after the last ``</think>``, else between the first
    ``###Response`` and the next; None where the answer has neither (it never finished
    thinking)."""
    if THINK_END in answer:
        return answer.rsplit(THINK_END, 1)[-1]
    if RESPONSE_MARKER in answer:
        return answer.split(RESPONSE_MARKER)[1]
    return None


def deepscaler(answer: str, label: Any, equivalent: Callable[[str, str], bool]) -> float:
    """1 if the last box after the thinking holds the label (``equivalent``: math
    equivalence of an extracted answer and the label)."""
    extracted = deepscaler_answer(answer)
    if extracted is None:
        return 0.0
    gold = str(label)
    if _BOXED in gold:
        unboxed = last_boxed(gold)
        if unboxed is None:
            return 0.0
        gold = unboxed
    if not gold:
        return 0.0
    return float(extracted.strip() == gold.strip() or equivalent(extracted, gold))


def deepscaler_answer(answer: str) -> str | None:
    """The answer deepscaler grades: the last box after the thinking."""
    solution = after_thinking(answer)
    return None if solution is None else last_boxed(solution)


def dapo(answer: str, label: Any) -> float:
    """1 if the last ``Answer:`` line, normalized, equals the integer label. Raises
    ``ValueError`` for a label that is not an integer."""
    gold = dapo_label(label)
    predicted = dapo_answer(answer)
    return float(predicted is not None and predicted == gold)


def dapo_label(label: Any) -> str:
    """The label as dapo compares it: normalized, then read as an integer; raises
    ``ValueError`` where it is none (DAPO's answers are integers)."""
    normalized = minerva_normalize(str(label))
    try:
        value = float(normalized)
        return str(int(value))
    except (ValueError, OverflowError):
        raise ValueError(f"dapo grades integer answers; the label {label!r} is not one") from None


def dapo_answer(answer: str) -> str | None:
    """The normalized content of the last ``Answer:`` line of the answer's end, or None."""
    found = _DAPO_ANSWER.findall(answer[-DAPO_TAIL_CHARS:])
    return minerva_normalize(found[-1]) if found else None


def minerva_normalize(text: str) -> str:
    """A final answer normalized as Minerva's (and lm-eval's hendrycks_math) grading does."""
    text = text.split("=")[-1]
    for before, after in _MINERVA_SUBSTITUTIONS:
        text = text.replace(before, after)
    for removed in _MINERVA_REMOVED:
        text = text.replace(removed, "")
    text = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", text)
    text = re.sub(r"(\\text\{)(.*?)(\})", "\\2", text)
    text = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", text)
    text = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", text)
    text = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", text)
    text = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", text)
    text = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def f1(answer: str, label: Any) -> float:
    """Token F1 of the normalized answer against the normalized label."""
    predicted = f1_normalize(answer)
    gold = f1_normalize(str(label))
    if (predicted in _YES_NO or gold in _YES_NO) and predicted != gold:
        return 0.0
    predicted_tokens, gold_tokens = predicted.split(), gold.split()
    same = sum((Counter(predicted_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision = same / len(predicted_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_normalize(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (SQuAD's normalization)."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def gpqa(answer: str, label: Any, metadata: Mapping[str, Any] | None) -> float:
    """1 if the answer picks the right option (see the module's description)."""
    metadata = metadata or {}
    choices = _choices(metadata)
    letters = _letters(metadata, choices)
    label_text = label.strip() if isinstance(label, str) else None
    correct = _correct_letter(metadata, label, label_text, letters, choices)
    picked = gpqa_answer(answer, letters)
    if picked is not None and correct is not None:
        return float(picked == correct)
    targets = []
    position = letters.index(correct) if correct in letters else None
    if position is not None and choices is not None and position < len(choices):
        targets.append(str(choices[position]))
    targets += [str(metadata[key]) for key in ("correct_answer", "answer_text") if metadata.get(key)]
    if label_text:
        targets.append(label_text)
    # Whole words only: a one-letter label would otherwise be found inside any word.
    response = f" {_plain(_strip_thinking(answer))} "
    if any(_plain(target) and f" {_plain(target)} " in response for target in targets):
        return 1.0
    if picked is not None and correct is None and label_text:
        return float(picked == label_text.upper())
    return 0.0


def gpqa_answer(answer: str, letters: Sequence[str] = GPQA_LETTERS) -> str | None:
    """The option letter the answer picks after its thinking: an "answer is X" phrase first,
    else its last standalone capital letter among ``letters``."""
    text = _strip_thinking(answer)
    if not text:
        return None
    for pattern in _GPQA_PATTERNS:
        match = pattern.search(text)
        if match and match.group(1).upper() in letters:
            return match.group(1).upper()
    for letter in reversed(re.findall(r"\b([A-Z])\b", text)):
        if letter in letters:
            return letter
    return None


def gpqa_letters(metadata: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The option letters of a record: its metadata's ``valid_letters``, one per ``choices``,
    or A-H."""
    metadata = metadata or {}
    return _letters(metadata, _choices(metadata))


def _choices(metadata: Mapping[str, Any]) -> list[Any] | None:
    choices = metadata.get("choices")
    if isinstance(choices, Mapping):
        return list(choices.values())
    if isinstance(choices, list | tuple):
        return list(choices)
    return None


def _letters(metadata: Mapping[str, Any], choices: list[Any] | None) -> tuple[str, ...]:
    valid = metadata.get("valid_letters")
    if isinstance(valid, list | tuple | str) and valid:
        return tuple(str(letter).upper() for letter in valid)
    if choices:
        return tuple(string.ascii_uppercase[: len(choices)])
    return GPQA_LETTERS


def _correct_letter(
    metadata: Mapping[str, Any],
    label: Any,
    label_text: str | None,
    letters: tuple[str, ...],
    choices: list[Any] | None,
) -> str | None:
    given = metadata.get("correct_letter")
    correct = given.strip().upper() if isinstance(given, str) else None
    if label_text is not None:
        if len(label_text) == 1 and label_text.upper() in letters and correct is None:
            correct = label_text.upper()
    elif isinstance(label, int | float) and not isinstance(label, bool):
        if 0 <= int(label) < len(letters):
            correct = letters[int(label)]
    if correct is None and choices and label_text:
        for index, choice in enumerate(choices):
            if index < len(letters) and _plain(str(choice)) == _plain(label_text):
                return letters[index]
    return correct


def _strip_thinking(text: str) -> str:
    return text.rsplit(THINK_END, 1)[-1] if THINK_END in text else text


def _plain(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()

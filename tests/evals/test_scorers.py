"""The built-in scorers and callables through ``score``."""

from __future__ import annotations

import pytest
import trio

from actorsys import ConfigError
from actorsys.evals import score
from actorsys.evals.scoring.scorers import chosen_letter


@pytest.mark.parametrize(
    ("answer", "label", "expected"),
    [(" 42\n", "42", 1.0), ("42.", "42", 0.0), ("Paris", " Paris ", 1.0), ("7", 7, 1.0)],
)
def test_exact_compares_stripped_strings(answer: str, label: object, expected: float) -> None:
    assert score("exact", answer, label) == expected


@pytest.mark.parametrize(
    ("answer", "label", "expected"),
    [
        ("so the total is 1,234.", 1234, 1.0),
        ("first 3 then 4", "4", 1.0),
        ("first 4 then 3", "4", 0.0),
        ("it is -0.50", "-0.5", 1.0),
        ("no digits here", 1, 0.0),
        ("about 3.0001", 3, 0.0),
    ],
)
def test_numeric_takes_the_last_number(answer: str, label: object, expected: float) -> None:
    assert score("numeric", answer, label) == expected


@pytest.mark.parametrize(
    ("answer", "label", "expected"),
    [
        ("so the answer is $\\boxed{\\frac{1}{2}}$", "0.5", 1.0),
        ("\\boxed{1/2}", "\\frac{1}{2}", 1.0),
        ("we get $x^2 + 2x + 1$", "(x+1)^2", 1.0),
        ("\\boxed{\\sqrt{2}}", "\\sqrt{2}", 1.0),
        ("\\boxed{3}", "4", 0.0),
        ("no math at all", "4", 0.0),
    ],
)
def test_math_uses_math_verify_equivalence(answer: str, label: str, expected: float) -> None:
    assert score("math", answer, label) == expected


async def test_math_scores_off_the_main_thread_too() -> None:
    result = await trio.to_thread.run_sync(score, "math", "\\boxed{0.25}", "\\frac{1}{4}")
    assert result == 1.0


@pytest.mark.parametrize(
    ("answer", "letter"),
    [
        ("The answer is (C).", "C"),
        ("Answer: b", "B"),
        ("\\boxed{D}", "D"),
        ("A) because it is red", "A"),
        ("I pick (E) here", "E"),
        ("I don't know", None),
    ],
)
def test_choice_finds_the_chosen_letter(answer: str, letter: str | None) -> None:
    assert chosen_letter(answer) == letter


def test_choice_labels_may_be_letters_or_indices() -> None:
    assert score("choice", "Answer: C", "C") == 1.0
    assert score("choice", "Answer: C", 2) == 1.0
    assert score("choice", "Answer: C", "(b)") == 0.0


def test_miles_rm_types_grade_with_miles_semantics_not_as_aliases() -> None:
    assert score("deepscaler", "\\boxed{2}", "2") == 0.0  # no </think>: miles scores 0
    assert score("deepscaler", "hmm</think>\\boxed{2}", "2") == 1.0
    assert score("gpqa", "Answer: A", "A") == 1.0


def test_callables_get_the_record_and_must_return_a_score_in_0_1() -> None:
    seen = []

    def half(answer: str, label: object, record: dict) -> float:
        seen.append(record)
        return 0.5

    assert score(half, "x", 1, {"id": 3}) == 0.5
    assert seen == [{"id": 3}]
    assert score(lambda a, label, r: True, "x", 1) == 1.0
    with pytest.raises(ValueError, match=r"returned 2; expected a number in \[0, 1\]"):
        score(lambda a, label, r: 2, "x", 1)


def test_an_unknown_scorer_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown scorer 'fuzzy'"):
        score("fuzzy", "a", "a")

"""A scorer that raises anything, ``SystemExit`` and ``KeyboardInterrupt`` included, scores
that answer 0 with the error: the scoring call never raises for a scorer."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from actorsys.evals.scoring.jobs import score_batch
from actorsys.evals.scoring.pool import score_in_workers


def exits(answer: str, label: Any, record: Any) -> float:
    if answer == "exit":
        sys.exit(3)
    if answer == "interrupt":
        raise KeyboardInterrupt
    return 1.0


def test_score_batch_turns_system_exit_and_keyboard_interrupt_into_zeros() -> None:
    scored = score_batch(exits, [("exit", "", {}), ("interrupt", "", {}), ("ok", "", {})])
    assert [value for value, _ in scored] == [0.0, 0.0, 1.0]
    assert "SystemExit(3)" in (scored[0][1] or "")
    assert "KeyboardInterrupt" in (scored[1][1] or "")


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_scorer_that_exits_in_its_worker_scores_zero_and_the_call_returns() -> None:
    items = [("exit", "", {}), ("ok", "", {}), ("interrupt", "", {}), ("ok", "", {})]
    scored = await score_in_workers(exits, items, score_timeout=60.0)
    assert [s.value for s in scored] == [0.0, 1.0, 0.0, 1.0]
    assert "SystemExit" in (scored[0].error or "")
    assert "KeyboardInterrupt" in (scored[2].error or "")

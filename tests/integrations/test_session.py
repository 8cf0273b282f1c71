"""What both trainer callbacks share: the row logged for a settled point, the points kept
until the trainer's thread takes them, and the arguments checked at construction."""

from __future__ import annotations

import pytest

from actorsys import ConfigError, EvalConfig, Outcome
from actorsys.integrations._session import SettledPoints, TrainingSession
from actorsys.sinks.rows import log_row


def test_an_ok_point_logs_its_numeric_metrics_at_eval_step() -> None:
    outcome = Outcome(step=20, status="ok", metrics={"eval/acc": 0.5, "eval/name": "x",  # type: ignore[dict-item]
                                                      "eval/nan": float("nan")})
    assert log_row(outcome) == {"eval/acc": 0.5, "eval/step": 20.0}


def test_a_skipped_point_logs_its_reason_as_a_count() -> None:
    outcome = Outcome(step=30, status="skipped", reason="timeout", metrics={"eval/lag_steps": 4})
    assert log_row(outcome) == {"eval/lag_steps": 4.0, "eval/skipped_timeout": 1.0,
                                "eval/step": 30.0}


def test_settled_points_are_taken_once_in_the_order_they_settled() -> None:
    points = SettledPoints()
    for step in (20, 10):
        points.record(Outcome(step=step, status="ok"))
    assert [o.step for o in points.take()] == [20, 10]
    assert points.take() == []


@pytest.mark.parametrize(("field", "kwargs"), [
    ("every", {"every": 0}), ("every", {"every": True}), ("every", {"every": 2.5}),
    ("drain_timeout", {"every": 10, "drain_timeout": -1.0}),
    ("config", {"every": 10, "config": {"hf_dir": "/tmp/x"}}),
])
def test_bad_arguments_name_their_field(field: str, kwargs: dict[str, object]) -> None:
    arguments: dict[str, object] = {"config": EvalConfig(), "eval_fn": None, "fleet": None,
                                    "sink": None, "drain_timeout": 600.0, **kwargs}
    with pytest.raises(ConfigError, match=field):
        TrainingSession(**arguments)  # type: ignore[arg-type]

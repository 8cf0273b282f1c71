"""How a point becomes a row: the one encoding of a skipped point and ``eval/step``, and W&B's
metric definitions against ``eval/step`` (a recording run here; real offline runs in
test_sinks.py and the trainer callbacks' tests)."""

from __future__ import annotations

from typing import Any

from actorsys import Outcome
from actorsys.sinks.rows import WandbEvalAxis, log_row, skip_reason


class RecordingRun:
    def __init__(self) -> None:
        self.defined: list[tuple[str, str | None]] = []
        self.logged: list[dict[str, Any]] = []

    def define_metric(self, name: str, step_metric: str | None = None) -> None:
        self.defined.append((name, step_metric))

    def log(self, row: dict[str, Any]) -> None:
        self.logged.append(row)


def test_a_skipped_point_is_a_count_under_its_reason_and_its_reason_as_text() -> None:
    skipped = Outcome(40, "skipped", metrics={"eval/lag_steps": 2, "eval/note": "x"})
    assert log_row(skipped) == {"eval/lag_steps": 2.0, "eval/skipped_unknown": 1.0,
                                "eval/step": 40.0}
    assert skip_reason(skipped) == "unknown"
    assert skip_reason(Outcome(1, "ok")) is None


def test_each_name_is_defined_once_a_run_against_eval_step() -> None:
    axis, first, second = WandbEvalAxis(), RecordingRun(), RecordingRun()
    axis.claim_prefix(first)
    axis.log(first, {"eval/acc": 0.5, "eval/step": 10.0})
    axis.log(first, {"eval/acc": 0.6, "train_loss": 1.0, "eval/step": 20.0})
    assert first.defined == [("eval/step", None), ("eval/*", "eval/step"),
                             ("eval/acc", "eval/step"), ("train_loss", "eval/step")]
    assert [row["eval/step"] for row in first.logged] == [10.0, 20.0]
    axis.log(second, {"eval/acc": 0.7, "eval/step": 30.0})
    assert second.defined == [("eval/acc", "eval/step"), ("eval/step", None)]

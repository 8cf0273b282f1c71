"""BestKeeper: the ranking of ok points by best_metric, what it lets go, best.json's contents,
and the stop signal (stop_when, patience). Pure logic, no files but best.json's writer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from actorsys import BestPoint, EvalConfig, Outcome
from actorsys.actors.best import BestKeeper, write_record


def ok(step: int, value: float | None, *, snapshot: str | None = "auto", **metrics: float) -> Outcome:
    if value is not None:
        metrics["eval/acc"] = value
    path = f"/s/step_{step}" if snapshot == "auto" else snapshot
    return Outcome(step=step, status="ok", metrics=metrics, snapshot=path)


def keeper(**fields: object) -> BestKeeper:
    return BestKeeper(EvalConfig(best_metric="eval/acc", **fields), "/s")  # type: ignore[arg-type]


def test_the_best_by_max_are_kept_best_first_and_the_displaced_are_let_go() -> None:
    best = keeper(keep_best=2)
    assert best.offer(ok(1, 0.5), owned=True).displaced == ()
    assert best.offer(ok(2, 0.7), owned=True).displaced == ()
    change = best.offer(ok(3, 0.6), owned=True)
    assert change.displaced == ("/s/step_1",)
    assert best.points == (BestPoint(2, 0.7, "/s/step_2"), BestPoint(3, 0.6, "/s/step_3"))
    assert best.kept == {"/s/step_2", "/s/step_3"} and best.protected == {2, 3}
    assert json.loads(change.record or b"") == [
        {"step": 2, "value": 0.7, "path": "/s/step_2"}, {"step": 3, "value": 0.6, "path": "/s/step_3"}
    ]


def test_a_point_worse_than_every_kept_one_changes_nothing() -> None:
    best = keeper(keep_best=1)
    best.offer(ok(1, 0.9), owned=True)
    change = best.offer(ok(2, 0.1), owned=True)
    assert change.displaced == () and change.record is None
    assert [p.step for p in best.points] == [1]


def test_min_mode_ranks_lower_first_and_a_tie_keeps_the_earlier_step() -> None:
    best = keeper(keep_best=2, best_mode="min")
    for step, value in ((1, 3.0), (2, 1.0), (3, 1.0), (4, 2.0)):
        best.offer(ok(step, value), owned=True)
    assert [(p.step, p.value) for p in best.points] == [(2, 1.0), (3, 1.0)]


def test_the_trainers_checkpoints_are_named_and_never_let_go_for_deleting() -> None:
    best = keeper(keep_best=1)
    best.offer(ok(1, 0.5, snapshot="/ckpt/1"), owned=False)
    change = best.offer(ok(2, 0.8, snapshot="/ckpt/2"), owned=False)
    assert change.displaced == () and best.kept == frozenset()
    assert best.points == (BestPoint(2, 0.8, "/ckpt/2"),) and best.protected == {2}


def test_a_served_point_ranks_with_no_snapshot() -> None:
    best = keeper(keep_best=1)
    best.offer(ok(1, 0.5, snapshot=None), owned=False)
    assert best.points == (BestPoint(1, 0.5, None),) and best.kept == frozenset()


def test_without_keep_best_the_one_best_point_is_known_but_nothing_is_kept() -> None:
    best = keeper()
    best.offer(ok(1, 0.5), owned=True)
    best.offer(ok(2, 0.6), owned=True)
    assert best.points == (BestPoint(2, 0.6, None),)
    assert best.kept == frozenset() and best.protected == frozenset()


def test_skipped_points_and_points_without_the_metric_do_not_rank() -> None:
    best = keeper(keep_best=2)
    best.offer(Outcome(step=1, status="skipped", reason="timeout", metrics={"eval/acc": 1.0}), owned=True)
    best.offer(ok(2, None, other=1.0), owned=True)
    best.offer(ok(3, float("nan")), owned=True)
    assert best.points == ()


def test_stop_when_holds_at_the_first_point_that_reaches_every_threshold() -> None:
    best = BestKeeper(EvalConfig(stop_when={"eval/a": 0.8, "eval/b": 0.5}), None)
    best.offer(ok(1, None, **{"eval/a": 0.9, "eval/b": 0.4}), owned=True)
    assert not best.should_stop
    best.offer(ok(2, None, **{"eval/a": 0.8}), owned=True)
    assert not best.should_stop
    best.offer(ok(3, None, **{"eval/a": 0.85, "eval/b": 0.5}), owned=True)
    assert best.should_stop and "step 3" in (best.stop_reason or "")
    best.offer(ok(4, None, **{"eval/a": 0.0, "eval/b": 0.0}), owned=True)
    assert best.should_stop and "step 3" in (best.stop_reason or "")


def test_stop_when_in_min_mode_is_reached_from_above() -> None:
    best = BestKeeper(EvalConfig(best_mode="min", stop_when={"eval/loss": 1.0}), None)
    best.offer(ok(1, None, **{"eval/loss": 1.5}), owned=True)
    assert not best.should_stop
    best.offer(ok(2, None, **{"eval/loss": 1.0}), owned=True)
    assert best.should_stop


def test_patience_counts_points_in_a_row_that_do_not_improve() -> None:
    best = keeper(patience=2)
    for step, value in ((1, 0.5), (2, 0.6), (3, 0.6), (4, 0.7), (5, 0.65)):
        best.offer(ok(step, value), owned=True)
        assert not best.should_stop, step
    best.offer(ok(6, None, other=0.0), owned=True)  # measured nothing: does not count
    assert not best.should_stop
    best.offer(ok(7, 0.69), owned=True)
    assert best.should_stop and "patience 2" in (best.stop_reason or "")


def test_best_json_is_replaced_whole_and_no_tmp_file_is_left(tmp_path: Path) -> None:
    path = str(tmp_path / "best.json")
    write_record(path, b"[1]\n")
    write_record(path, b"[2]\n")
    assert Path(path).read_bytes() == b"[2]\n" and os.listdir(tmp_path) == ["best.json"]


def test_best_json_is_not_written_through_a_planted_link(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("mine")
    (tmp_path / "best.json").symlink_to(target)
    write_record(str(tmp_path / "best.json"), b"[]\n")
    assert target.read_text() == "mine" and (tmp_path / "best.json").read_bytes() == b"[]\n"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"keep_best": 1}, "best_metric"),
        ({"patience": 3}, "best_metric"),
        ({"best_metric": "eval/acc", "patience": 0}, "patience"),
        ({"best_metric": "eval/acc", "keep_best": -1}, "keep_best"),
        ({"best_mode": "up"}, "best_mode"),
        ({"best_metric": ""}, "best_metric"),
        ({"stop_when": {}}, "stop_when"),
        ({"stop_when": {"eval/acc": "high"}}, "stop_when"),
        ({"stop_when": {"eval/acc": float("inf")}}, "stop_when"),
    ],
)
def test_bad_deciding_fields_name_the_field(fields: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        EvalConfig(**fields)  # type: ignore[arg-type]

"""'report' on a metrics file that holds a step twice (a point evaluated again after a crash,
or a trainer resumed from an earlier checkpoint): the step's last line stands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actorsys.cli import main
from actorsys.metrics_file import Point, last_of_each_step, read_points
from tests.cli.test_report_stats import A, B, row, write


def test_the_last_row_of_a_step_is_the_one_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = row(200, A)
    metrics = write(tmp_path / "metrics.jsonl", [row(100, A), first, row(200, B)])
    assert main(["report", str(metrics)]) == 0
    out = capsys.readouterr().out
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines()
            if line.count("│") > 2]
    [step_200] = [cells for cells in rows if cells[0].lstrip("* ") == "200"]
    again = json.loads(metrics.read_text().splitlines()[2])["metrics"]
    assert first["metrics"]["eval/math"] != again["eval/math"]
    assert step_200[2] == f"{again['eval/math']:.3f} ± {again['eval/math/stderr']:.3f}"
    assert "2 ok, 0 not ok" in out


def test_last_of_each_step_keeps_the_later_line_by_step() -> None:
    points = [Point(2, "ok", None, {"x": 1.0}), Point(1, "skipped", "closed"),
              Point(2, "skipped", "crashed"), Point(1, "ok", None, {"x": 3.0})]
    assert last_of_each_step(points) == [points[3], points[2]]


def test_read_points_still_gives_every_line(tmp_path: Path) -> None:
    metrics = write(tmp_path / "metrics.jsonl", [row(1, A), row(1, B)])
    assert [p.step for p in read_points(metrics)] == [1, 1]

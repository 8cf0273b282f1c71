"""The one JSONL append and read: a torn last line (a killed writer's) is ended before the next
append and reported, never fatal, by the reader; the metrics sink and the report share them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actorsys import JsonlSink, Outcome
from actorsys._errors import UnsafePathError
from actorsys._jsonl import append_lines, encode_line, read_lines
from actorsys.metrics_file import read_points


def test_an_append_after_a_torn_line_starts_a_new_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n{"b": 2')
    append_lines(str(path), [encode_line({"c": 3}), encode_line({"d": {1, 2}})])
    lines = read_lines(path)
    assert [line.number for line in lines] == [1, 2, 3, 4]
    assert [line.row for line in lines] == [{"a": 1}, None, {"c": 3}, {"d": repr({1, 2})}]
    assert lines[1].problem is not None and lines[1].problem.startswith("not JSON")


def test_the_reader_says_why_a_line_is_no_object(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('[1]\n\n' + "[" * 100_000 + "\n" + '{"ok": true}\n')
    problems = [(line.number, line.problem) for line in read_lines(path)]
    assert problems == [(1, "a JSON list, not an object"), (3, "JSON nested too deeply to parse"),
                        (4, None)]


def test_a_private_read_and_every_append_refuse_a_link(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text('{"a": 1}\n')
    link = tmp_path / "rows.jsonl"
    link.symlink_to(target)
    assert [line.row for line in read_lines(link)] == [{"a": 1}]
    with pytest.raises(UnsafePathError):
        read_lines(link, private=True)
    with pytest.raises(UnsafePathError):
        append_lines(str(link), [encode_line({"b": 2})])
    assert target.read_text() == '{"a": 1}\n'


def test_the_metrics_sink_ends_a_torn_line_the_report_skips(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "status": "ok", "reason": None}) + '\n{"step": 2, "sta')
    sink = JsonlSink(path)
    for step in (3, 4):
        sink.record(Outcome(step, "ok", metrics={"eval/acc": step / 10}))
    assert sink.flush(timeout=30)
    sink.close()
    assert sink.errors == 0
    assert [(p.step, p.metrics) for p in read_points(path)] == [
        (1, {}), (3, {"eval/acc": 0.3}), (4, {"eval/acc": 0.4})
    ]

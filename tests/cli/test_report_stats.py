"""'report' with standard errors: value ± stderr, the best point, the band in the plot, and
'--compare A B', a paired test over the prompts both points scored, on a known difference."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

from actorsys.cli import main
from actorsys.cli.compare import compare, prompt_means
from actorsys.evals.scoring.metrics import Sample, dataset_metrics


def row(step: int, scores: list[list[float]], name: str = "math", **extra: Any) -> dict[str, Any]:
    """An ok point as JsonlSink writes it: metrics computed from ``scores`` (a prompt's
    samples), and the samples in data["samples"]."""
    samples = [Sample(f"q{i}", "a", "a", score) for i, group in enumerate(scores) for score in group]
    metrics = dataset_metrics(name, samples, len(scores[0]))
    return {"step": step, "status": "ok", "reason": None, "metrics": metrics,
            "data": {"samples": {name: [s.as_record() for s in samples]}}, **extra}


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err


# step A: 40 prompts, 2 samples each; step B: the first sample of prompts 0..19 is right (the
# 10 even ones gain 0.5 each) and that of prompts 21 and 23 wrong (they lose 0.5 each), so
# B - A = (10 - 2) * 0.5 / 40 = 0.1 exactly, over prompts moved both ways
A = [[float(i % 2), float(i % 3 == 0)] for i in range(40)]
B = [[1.0 if i < 20 else 0.0 if i in (21, 23) else first, second]
     for i, (first, second) in enumerate(A)]


def known_difference() -> list[float]:
    return [sum(b) / 2 - sum(a) / 2 for a, b in zip(A, B, strict=True)]


def test_compare_gives_the_paired_difference_its_stderr_and_scipys_p_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    differences = known_difference()
    assert sum(d != 0 for d in differences) > 5  # the construction moved prompts both ways
    expected = sum(differences) / 40
    assert expected == pytest.approx(0.1)
    metrics = write(tmp_path / "metrics.jsonl",
                    [row(100, A), {"step": 150, "status": "skipped", "reason": "timeout"},
                     row(200, B)])
    assert main(["report", str(metrics), "--compare", "100", "200"]) == 0
    out = capsys.readouterr().out
    (found,) = compare(*(json.loads(line)["data"]["samples"]
                         for line in metrics.read_text().splitlines()[::2]))
    assert found.prompts == 40
    assert found.difference == pytest.approx(expected)
    assert found.stderr == pytest.approx(statistics.stdev(differences) / math.sqrt(40))
    t = expected / found.stderr
    assert found.p_value == pytest.approx(2 * stats.t.sf(abs(t), df=39))
    assert found.p_value < 0.05
    assert f"{expected:+.3f}" in out and f"{found.stderr:.3f}" in out and "40" in out


def test_compare_matches_prompts_by_text_and_leaves_out_those_one_point_lacks() -> None:
    a = {"math": [{"prompt": "x", "score": 1.0}, {"prompt": "x", "score": 0.0},
                  {"prompt": "y", "score": 0.0}, {"prompt": "only a", "score": 1.0}],
         "other": [{"prompt": "z", "score": 1.0}]}
    b = {"math": [{"prompt": "y", "score": 1.0}, {"prompt": "x", "score": 1.0},
                  {"prompt": "x", "score": 1.0}, {"prompt": "bad", "score": "1"}]}
    assert prompt_means(a["math"]) == {"x": 0.5, "y": 0.0, "only a": 1.0}
    (found,) = compare(a, b)
    assert (found.dataset, found.prompts, found.a, found.b) == ("math", 2, 0.25, 1.0)
    assert found.difference == 0.75
    same = compare(a, a)
    assert [(c.dataset, c.difference, c.stderr) for c in same] == [("math", 0.0, 0.0),
                                                                    ("other", 0.0, 0.0)]
    assert same[0].p_value == 1.0  # no prompt moved
    assert same[1].prompts == 1 and math.isnan(same[1].p_value)  # one prompt: no test


def test_the_table_prints_value_plus_minus_stderr_and_stars_the_best_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = write(tmp_path / "metrics.jsonl", [row(100, A), row(200, B)])
    png = tmp_path / "plot.png"
    assert main(["report", str(metrics), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    b = json.loads(metrics.read_text().splitlines()[1])["metrics"]
    assert f"{b['eval/math']:.3f} ± {b['eval/math/stderr']:.3f}" in out
    assert "* 200" in out and "best: step 200 by eval/math" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["report", str(metrics), "--best-metric", "math", "--best-mode", "min"]) == 0
    assert "* 100" in capsys.readouterr().out
    best = tmp_path / "best.json"
    best.write_text(json.dumps([{"step": 200, "value": 0.1, "path": "/x"}]))
    assert main(["report", str(metrics), "--best-json", str(best)]) == 0
    assert "best: step 200 (best.json)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--compare", "100"], "--compare"),
        (["--compare", "100", "x"], "--compare"),
        (["--compare", "100", "-1"], "--compare"),
        (["--compare", "100", "300"], "--compare"),
        (["--compare", "100", "150"], "--compare"),
        (["--compare", "100", "250"], "--compare"),
        (["--best-metric", "eval/nope"], "--best-metric"),
        (["--best-mode", "median"], "--best-mode"),
        (["--best-json", "/no/such.json"], "--best-json"),
        (["--best-json", "BAD"], "--best-json"),
    ],
)
def test_a_bad_argument_is_one_line_naming_it_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"step": 1}')
    no_samples = {"step": 250, "status": "ok", "metrics": {"eval/math": 0.5}}
    metrics = write(tmp_path / "metrics.jsonl",
                    [row(100, A), {"step": 150, "status": "skipped", "reason": "timeout"},
                     no_samples])
    argv = [str(bad) if a == "BAD" else a for a in argv]
    try:
        code = main(["report", str(metrics), *argv])
    except SystemExit as exited:
        code = exited.code
    assert code == 2
    assert named in one_line_error(capsys)


def test_report_help_names_the_new_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["report", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for option in ("--compare", "--best-metric", "--best-mode", "--best-json", "--png"):
        assert option in out

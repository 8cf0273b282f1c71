"""Misuse of 'engine' and 'report': one line naming the problem, exit 2, never a traceback;
a metrics file's unreadable lines are skipped with a warning naming the file and the line."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from actorsys.cli import main


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A directory that passes for a checkpoint on the command line (nothing loads it: every
    misuse below is refused before the model is read)."""
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--port", "-1"], "--port"),
        (["--port", "70000"], "--port"),
        (["--port", "http"], "--port"),
        (["--max-batch", "0"], "--max-batch"),
        (["--threads", "-2"], "--threads"),
        (["--max-body-bytes", "0"], "--max-body-bytes"),
        (["--priority-grace", "-0.1"], "--priority-grace"),
        (["--priority-grace", "nan"], "--priority-grace"),
    ],
)
def test_engine_bad_numbers_are_one_line_exit_2(
    flags: list[str], names: str, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["engine", "--model", str(model_dir), "--port", "0", *flags])
    assert exited.value.code == 2
    assert names in one_line_error(capsys)


def test_engine_on_a_missing_model_dir_never_asks_a_hub(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["engine", "--model", str(tmp_path / "nonexistent"), "--port", "0"])
    assert exited.value.code == 2
    err = one_line_error(capsys)
    assert "--model" in err and "nothing is fetched from a hub" in err


def test_engine_on_another_address_without_a_key_is_refused(
    model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ACTORSYS_API_KEY", raising=False)
    assert main(["engine", "--model", str(model_dir), "--port", "0", "--host", "0.0.0.0"]) == 2
    err = one_line_error(capsys)
    assert "--host" in err and "--api-key" in err
    assert main(["engine", "--model", str(model_dir), "--port", "0", "--api-key", ""]) == 2
    assert "--api-key" in one_line_error(capsys)


def test_engine_on_a_taken_port_is_one_line_exit_2(
    model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        assert main(["engine", "--model", str(model_dir), "--port", port]) == 2
    assert "--port" in one_line_error(capsys)


def test_report_png_in_a_missing_directory_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "status": "ok", "metrics": {"eval/a": 1.0}}) + "\n")
    with pytest.raises(SystemExit) as exited:
        main(["report", str(metrics), "--png", str(tmp_path / "nonexistent" / "dir" / "x.png")])
    assert exited.value.code == 2
    assert "--png" in one_line_error(capsys)


def test_report_skips_lines_that_are_not_records_naming_the_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    lines = [
        json.dumps({"step": 1, "status": "ok", "metrics": {"eval/a": 0.25}}),
        "[1,2]",
        "[" * 200_000 + "]" * 200_000,
        json.dumps({"step": 2, "status": "ok", "metrics": [1]}),
        json.dumps({"step": 3, "status": "ok", "metrics": {"eval/a": 10**400}}),
        json.dumps({"step": 4, "status": "skipped", "reason": "[bold]x[/]", "metrics": {}}),
        json.dumps({"step": 5, "status": "ok", "metrics": {"eval/a": 0.75}}),
    ]
    metrics.write_text("\n".join(lines) + "\n")
    assert main(["report", str(metrics)]) == 0
    captured = capsys.readouterr()
    assert "0.250" in captured.out and "0.750" in captured.out and "[bold]x[/]" in captured.out
    for number in (2, 3, 4, 5):
        assert f"{metrics} line {number} is not a metrics record" in captured.err
    assert "Traceback" not in captured.err

"""Every command: --help works, a bad argument is one line naming it and the fix (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actorsys.cli import main


@pytest.mark.parametrize("command", [[], ["demo"], ["watch"], ["report"], ["engine"]])
def test_every_command_has_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    assert exited.value.code == 0
    assert "usage: actorsys" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["demo", "--steps", "0"], "--steps"),
        (["demo", "--engine", "tpu"], "--engine"),
        (["demo", "--bogus"], "--help"),
        (["watch", "/no/such/dir"], "DIR"),
        (["watch", ".", "--engines", "2", "--engine-url", "http://x"], "--engine-url"),
        (["watch", ".", "--poll-interval", "-1"], "--poll-interval"),
        (["report", "/no/such.jsonl"], "METRICS.jsonl"),
        (["watch", ".", "--apply-chat-template-kwargs", "{enable_thinking: false}"],
         "--apply-chat-template-kwargs"),
        (["watch", ".", "--custom-rm-path", "no.such.scorer"], "--custom-rm-path"),
    ],
)
def test_a_bad_argument_is_one_line_naming_it_exit_2(
    argv: list[str], names: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert names in err


def test_watch_without_datasets_says_which_flags_to_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["watch", str(tmp_path), "--once"])
    assert exited.value.code == 2
    assert "--eval-prompt-data" in capsys.readouterr().err.splitlines()[-1]


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "COMMAND is required" in capsys.readouterr().err


def test_report_prints_a_table_and_writes_a_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 10, "status": "ok", "metrics": {"eval/math": 0.25, "eval/lag_steps": 3}},
        {"step": 20, "status": "skipped", "reason": "timeout", "metrics": {}},
        {"step": 30, "status": "ok", "metrics": {"eval/math": 0.5, "eval/lag_steps": 1}},
    ]
    metrics.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"step": 40, "sta')
    png = tmp_path / "plot.png"
    assert main(["report", str(metrics), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "0.250" in out and "0.500" in out and "timeout" in out and "2 ok, 1 not ok" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

"""``actorsys watch`` in-process, up to the watcher: what it refuses (one line, exit 2) and the
settings it builds from the trainer's own evaluation flags."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from actorsys.cli import main
from actorsys.watch.lock import OutLock
from actorsys.watch.service import Watcher, WatchReport

UNUSED_URL = "http://127.0.0.1:9"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.jsonl"
    path.write_text(json.dumps({"prompt": "one two", "label": "three"}) + "\n")
    return path


def watch(tmp_path: Path, data: Path, *extra: str) -> list[str]:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(exist_ok=True)
    return ["watch", str(ckpt), "--eval-prompt-data", "tiny", str(data), "--engine-url",
            UNUSED_URL, "--once", "--log-level", "warning", *extra]


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    ("out", "names"),
    [("/proc/x", "cannot create /proc/x"), ("AFILE", "is not a directory")],
)
def test_an_out_that_cannot_hold_the_output_is_one_line_exit_2(
    tmp_path: Path, data: Path, out: str, names: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if out == "AFILE":
        out = str(tmp_path / "afile")
        Path(out).write_text("mine")
    with pytest.raises(SystemExit) as exited:
        main(watch(tmp_path, data, "--out", out))
    assert exited.value.code == 2
    err = one_line_error(capsys)
    assert "--out" in err and names in err and "Traceback" not in err


def test_a_second_watch_on_the_same_out_is_one_line_naming_the_holders_pid(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    held = OutLock(str(out))
    held.acquire()
    try:
        assert main(watch(tmp_path, data, "--out", str(out))) == 2
    finally:
        held.release()
    err = one_line_error(capsys)
    assert f"pid {os.getpid()}" in err and str(out / ".lock") in err
    assert not (out / "ledger.jsonl").exists()


@pytest.mark.parametrize("flag", [["--eval-hf-dir", "/tmp/x"], ["--eval-max-in-flight", "4"],
                                  ["--eval-keep-snapshots", "3"], ["--eval-resume"],
                                  ["--eval-shared-update", "preempt"]])
def test_an_eval_flag_watch_sets_itself_is_refused(
    tmp_path: Path, data: Path, flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(watch(tmp_path, data, *flag))
    assert exited.value.code == 2
    assert one_line_error(capsys).startswith(f"actorsys watch: argument {flag[0]}: ")


@pytest.mark.parametrize("marker", ["a/b", ".."])
def test_a_marker_that_is_not_a_file_name_is_refused(
    tmp_path: Path, data: Path, marker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(watch(tmp_path, data, "--marker", marker))
    assert exited.value.code == 2
    assert "--marker" in one_line_error(capsys)


def test_the_watchers_settings_come_from_the_trainers_eval_flags(
    tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []

    async def run(self: Watcher) -> WatchReport:
        seen.append(self.settings)
        return WatchReport()

    monkeypatch.setattr(Watcher, "run", run)
    argv = watch(tmp_path, data, "--out", str(tmp_path / "out"), "--eval-timeout", "7",
                 "--eval-pin-timeout", "8", "--eval-close-timeout", "9", "--eval-probe", "off",
                 "--marker", "STABLE")
    assert main(argv) == 0
    (settings,) = seen
    config = settings.config
    assert (config.eval_timeout, config.pin_timeout, config.close_timeout, config.probe) == (
        7.0, 8.0, 9.0, False
    )
    assert settings.marker == "STABLE"


def test_watch_help_lists_the_shared_eval_flags_and_not_those_watch_sets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["watch", "--help"])
    text = capsys.readouterr().out
    for flag in ("--eval-timeout", "--eval-pin-timeout", "--eval-close-timeout", "--eval-probe",
                 "--eval-prompt-data", "--marker"):
        assert flag in text
    for flag in ("--eval-hf-dir", "--eval-max-in-flight", "--eval-keep-snapshots", "--eval-resume"):
        assert flag not in text

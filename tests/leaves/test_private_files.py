"""Files of ours (locks, ledger, metrics, logs) are never opened through a link another user
planted, never another user's file, and never in a directory every user may write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from actorsys import JsonlSink, Outcome
from actorsys._core.staging_claim import LOCK_NAME, claim_staging_dir
from actorsys._errors import UnsafePathError
from actorsys._files import open_private
from actorsys.watch.ledger import Ledger
from actorsys.watch.lock import OutLock


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("precious\n")
    return path


def test_a_planted_lock_link_in_out_is_refused_and_its_target_untouched(
    tmp_path: Path, victim: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").symlink_to(victim)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        OutLock(str(out)).acquire()
    assert victim.read_text() == "precious\n"


def test_a_planted_staging_lock_link_is_refused_and_its_target_untouched(
    tmp_path: Path, victim: Path
) -> None:
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / LOCK_NAME).symlink_to(victim)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        claim_staging_dir(str(hf_dir))
    assert victim.read_text() == "precious\n"


def test_a_planted_ledger_link_is_neither_read_nor_appended_to(
    tmp_path: Path, victim: Path
) -> None:
    (tmp_path / "ledger.jsonl").symlink_to(victim)
    with pytest.raises(UnsafePathError):
        Ledger(tmp_path / "ledger.jsonl")
    assert victim.read_text() == "precious\n"


def test_a_planted_metrics_link_is_a_counted_sink_error(tmp_path: Path, victim: Path) -> None:
    (tmp_path / "metrics.jsonl").symlink_to(victim)
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    sink.record(Outcome(1, "ok", metrics={"eval/acc": 1.0}))
    sink.close(timeout=10)
    assert sink.errors == 1
    assert victim.read_text() == "precious\n"


def test_a_fifo_hard_link_or_world_writable_dir_is_refused(tmp_path: Path, victim: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsafePathError, match="not a regular file"):
        open_private(str(tmp_path / "fifo"), os.O_WRONLY | os.O_CREAT)
    os.link(victim, tmp_path / "hard")
    with pytest.raises(UnsafePathError, match="hard links"):
        open_private(str(tmp_path / "hard"), os.O_WRONLY | os.O_TRUNC)
    assert victim.read_text() == "precious\n"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UnsafePathError, match="every user may write"):
        open_private(str(shared / "x"), os.O_WRONLY | os.O_CREAT)
    assert not (shared / "x").exists()
    shared.chmod(0o1777)  # sticky, like /tmp: others cannot rename our files there
    os.close(open_private(str(shared / "x"), os.O_WRONLY | os.O_CREAT))


def test_a_file_of_ours_opens_and_truncates_only_after_the_checks(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("old")
    fd = open_private(str(path), os.O_WRONLY | os.O_TRUNC)
    os.close(fd)
    assert path.read_text() == ""


def test_watch_on_an_out_with_a_planted_lock_link_is_one_line_exit_2(
    tmp_path: Path, victim: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from actorsys.cli import main

    data = tmp_path / "tiny.jsonl"
    data.write_text('{"prompt": "one two", "label": "three"}\n')
    (tmp_path / "ckpt").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").symlink_to(victim)
    argv = ["watch", str(tmp_path / "ckpt"), "--eval-prompt-data", "tiny", str(data),
            "--engine-url", "http://127.0.0.1:9", "--once", "--log-level", "warning",
            "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "symbolic link" in err, err
    assert victim.read_text() == "precious\n"


def test_an_engine_log_that_is_a_planted_link_is_refused(tmp_path: Path, victim: Path) -> None:
    from actorsys.fleet._proc.process import spawn

    (tmp_path / "engine-0.log").symlink_to(victim)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        spawn("engine-0", ["true"], log_path=str(tmp_path / "engine-0.log"))
    assert victim.read_text() == "precious\n"

"""The scan over real directories: which checkpoints are complete, by which marker, and what
a symlink, a loop or a dangling link does to it (never a crash, never a walk out of DIR)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from actorsys.watch.scan import Completion, Scanner, fingerprint

OLD = 1_000_000.0


def make_checkpoint(root: Path, name: str, *files: str) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"weights")
    for file in files:
        (path / file).write_text("")
    return path


def age(path: Path) -> None:
    """Every entry under ``path`` (links themselves, never their targets) last changed at OLD."""
    for directory, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.utime(os.path.join(directory, name), (OLD, OLD), follow_symlinks=False)
    os.utime(path, (OLD, OLD))


def names(root: Path, **completion: object) -> list[str]:
    scanner = Scanner(str(root), Completion(**completion))  # type: ignore[arg-type]
    return [c.name for c in scanner.scan(now=time.time())]


def test_transformers_checkpoints_are_complete_once_they_hold_the_trainer_state(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, "checkpoint-10", "trainer_state.json")
    make_checkpoint(tmp_path, "checkpoint-20")
    make_checkpoint(tmp_path, "step_30", "trainer_state.json")
    make_checkpoint(tmp_path, "step_40", ".complete")
    assert names(tmp_path) == ["checkpoint-10", "step_40"]


def test_a_named_marker_is_the_only_one_that_counts(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, "step_10", "STABLE")
    make_checkpoint(tmp_path, "step_20", ".complete")
    make_checkpoint(tmp_path, "checkpoint-30", "trainer_state.json")
    assert names(tmp_path, marker="STABLE") == ["step_10"]


def test_a_symlink_loop_inside_a_quiet_checkpoint_is_one_more_file(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path, "step_10")
    os.symlink("loop", path / "loop")
    os.symlink(".", path / "here")
    age(path)
    assert names(tmp_path, quiet_seconds=60.0) == ["step_10"]


def test_a_dangling_link_does_not_keep_a_quiet_checkpoint_from_being_due(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path, "step_10")
    os.symlink(tmp_path / "gone", path / "tokenizer.json")
    age(path)
    assert names(tmp_path, quiet_seconds=60.0) == ["step_10"]


def test_a_checkpoint_linked_out_of_dir_is_left_out_logged_once_and_never_walked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "ckpt"
    outside = make_checkpoint(tmp_path / "elsewhere", "big", ".complete")
    (outside / "deep").mkdir()
    age(outside)
    root.mkdir()
    os.symlink(outside, root / "step_10")
    inside = make_checkpoint(root, "real_20", ".complete")
    os.symlink(inside, root / "step_30")
    walked: list[str] = []
    scandir = os.scandir

    def recording_scandir(path: str) -> object:
        walked.append(os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", recording_scandir)
    scanner = Scanner(str(root), Completion(quiet_seconds=60.0))
    with caplog.at_level(logging.WARNING, logger="actorsys.watch"):
        for _ in range(3):
            assert [c.name for c in scanner.scan(now=time.time())] == ["real_20", "step_30"]
    assert not [path for path in walked if path.startswith((str(outside), str(root / "step_10")))]
    assert [r.getMessage() for r in caplog.records].count(
        f"{str(root / 'step_10')!r} is a link to {outside}, outside {root}; left out"
    ) == 1


def test_an_unreadable_checkpoint_is_left_out_and_the_scan_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = make_checkpoint(tmp_path, "step_10")
    make_checkpoint(tmp_path, "step_20")
    for path in (tmp_path / "step_10", tmp_path / "step_20"):
        age(path)
    scandir = os.scandir

    def failing_scandir(path: str) -> object:
        if os.fspath(path) == str(bad):
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", failing_scandir)
    assert names(tmp_path, quiet_seconds=60.0) == ["step_20"]


def test_the_fingerprint_changes_with_the_weights_and_only_with_them(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path, "step_10", ".complete")
    before = fingerprint(str(path))
    (path / "README.md").write_text("notes")
    assert fingerprint(str(path)) == before
    (path / "model.safetensors").write_bytes(b"other weights")
    assert fingerprint(str(path)) != before


def test_a_checkpoint_whose_weights_are_a_fifo_is_not_complete_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_checkpoint(tmp_path, "step_1", ".complete")
    path = make_checkpoint(tmp_path, "step_2", ".complete")
    (path / "model.safetensors").unlink()
    os.mkfifo(path / "model.safetensors")
    caplog.set_level(logging.WARNING, "actorsys.watch")
    scanner = Scanner(str(tmp_path))
    assert [c.name for c in scanner.scan(now=time.time())] == ["step_1"]
    assert [c.name for c in scanner.scan(now=time.time())] == ["step_1"]
    said = [r.getMessage() for r in caplog.records if "a FIFO" in r.getMessage()]
    assert len(said) == 1 and "'model.safetensors' (a FIFO), not a regular file" in said[0]


def test_a_name_with_a_control_character_is_no_checkpoint_and_names_are_logged_quoted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_checkpoint(tmp_path, "evil\nstep_6", ".complete")
    make_checkpoint(tmp_path, "step_\x1b[2K7", ".complete")
    make_checkpoint(tmp_path, "step_8", ".complete")
    assert names(tmp_path) == ["step_8"]
    (tmp_path / "étape_9").symlink_to("/")
    caplog.set_level(logging.WARNING, "actorsys.watch")
    Scanner(str(tmp_path)).scan(now=time.time())
    [line] = [r.getMessage() for r in caplog.records if "outside" in r.getMessage()]
    assert line.startswith(f"{str(tmp_path / 'étape_9')!r} is a link to /,")

"""Finding checkpoints: the subdirectories of a directory whose names end in a step number.

When one is complete (:class:`Completion`): it holds actorsys's ``.complete``; or it is a
transformers ``checkpoint-N`` that holds ``trainer_state.json``; or, with ``marker``, it holds
that file instead (prime-rl writes ``STABLE``), and only then; or, with ``quiet_seconds``,
nothing in it changed for that long (for trainers that write no marker). Hidden directories
(``.tmp-`` and the like) are never checkpoints.

Scans poll: checkpoint dirs often live on network filesystems, where inotify does not fire.
A scan never follows a symlink out of the directory: a checkpoint that is a link to a place
outside it is left out (logged once), and inside a checkpoint links are looked at, never
through, so a loop or a dangling link is one more file. A checkpoint that cannot be read is
left out and logged once, never an error of the scan; so is one that holds a FIFO, a device or
a socket (:func:`~actorsys.fleet.checkpoint.special_file`: an engine that opened it would wait
for good), and a name with a control character (``evil\nstep_6`` is no step 6). Names are
logged with ``%r``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

from actorsys.fleet.checkpoint import special_file
from actorsys.staging import COMPLETE, WEIGHT_SUFFIXES

log = logging.getLogger("actorsys.watch")

STEP_SUFFIX = re.compile(r"([0-9]+)\Z")
"""ASCII digits at the very end: a ``\\d`` would take other scripts' digits (``step_٥``), and
a ``$`` a trailing newline, as step 5."""
TRAINER_CHECKPOINT = re.compile(r"checkpoint-[0-9]+\Z")
TRAINER_STATE = "trainer_state.json"
"""transformers' ``Trainer._save_checkpoint`` writes it last into ``checkpoint-N``: after the
model, the optimizer and scheduler, the scaler and the RNG state (transformers 5.24)."""


@dataclass(frozen=True, order=True)
class Checkpoint:
    """``name``: the subdirectory's name; ``path``: absolute; ``marked``: it holds
    ``.complete``, which the supervisor checks again before pinning. ``fingerprint``: the
    names, sizes and modification times of its weight files (with the name, the ledger's
    key: a checkpoint rewritten in place is another checkpoint)."""

    step: int
    name: str
    path: str
    marked: bool
    fingerprint: str = field(default="", compare=False)


@dataclass(frozen=True)
class Completion:
    """When a checkpoint counts as complete. ``marker``: the one file that says so (None:
    ``.complete``, or ``trainer_state.json`` in a transformers ``checkpoint-N``).
    ``quiet_seconds``: also complete once nothing in it changed for that long."""

    marker: str | None = None
    quiet_seconds: float | None = None

    def marked(self, name: str, path: str) -> bool:
        """Whether the checkpoint ``name`` at ``path`` holds its completion file. Blocking."""
        if self.marker is not None:
            return holds_file(path, self.marker)
        if holds_file(path, COMPLETE):
            return True
        return bool(TRAINER_CHECKPOINT.search(name)) and holds_file(path, TRAINER_STATE)


def holds_file(directory: str, name: str) -> bool:
    """Whether ``directory`` holds a regular file ``name`` (a link there does not count).
    Blocking."""
    try:
        return stat.S_ISREG(os.lstat(os.path.join(directory, name)).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def step_of(name: str) -> int | None:
    """The step a directory name ends in (``step_120``, ``iter_0000120``, ``checkpoint-120``),
    or None. Hidden names and names with a control character are no checkpoint's."""
    if name.startswith(".") or any(ord(c) < 32 or 127 <= ord(c) < 160 for c in name):
        return None
    match = STEP_SUFFIX.search(name)
    return int(match.group(1)) if match else None


class Scanner:
    """Scans of ``root`` by one rule of completion; remembers which problems it logged, so
    each is logged once."""

    def __init__(self, root: str, completion: Completion | None = None) -> None:
        self.root = os.path.abspath(root)
        self.completion = completion or Completion()
        self._logged: set[tuple[str, str]] = set()

    def scan(self, *, now: float) -> list[Checkpoint]:
        """The complete checkpoints under ``root``, by step (then name). ``now`` is the
        wall-clock time (``time.time()``) to judge ``quiet_seconds`` by. Blocking (reads the
        directory and stats what is in the checkpoints); a checkpoint removed while it is
        scanned is left out."""
        try:
            entries = list(os.scandir(self.root))
            real_root = os.path.realpath(self.root)
        except OSError as exc:
            self._warn_once(self.root, f"cannot be read ({exc.strerror or exc}); nothing found")
            return []
        found: list[Checkpoint] = []
        for entry in entries:
            step = step_of(entry.name)
            if step is None:
                continue
            try:
                checkpoint = self._checkpoint(entry, step, real_root, now)
            except FileNotFoundError:
                continue
            except OSError as exc:
                self._warn_once(entry.path, f"cannot be read ({exc.strerror or exc}); left out")
                continue
            if checkpoint is not None:
                found.append(checkpoint)
        return sorted(found)

    def _checkpoint(
        self, entry: os.DirEntry[str], step: int, real_root: str, now: float
    ) -> Checkpoint | None:
        path = os.path.abspath(entry.path)
        if entry.is_symlink():
            target = os.path.realpath(path)
            if target == real_root or os.path.commonpath([target, real_root]) != real_root:
                self._warn_once(path, f"is a link to {target}, outside {self.root}; left out")
                return None
        if not entry.is_dir(follow_symlinks=True):
            return None
        quiet = self.completion.quiet_seconds
        if not self.completion.marked(entry.name, path) and (
            quiet is None or not _quiet_since(path, now - quiet)
        ):
            return None
        special = special_file(path)
        if special is not None:
            self._warn_once(path, f"holds {special}, not a regular file; left out")
            return None
        return Checkpoint(step, entry.name, path, holds_file(path, COMPLETE), fingerprint(path))

    def _warn_once(self, path: str, problem: str) -> None:
        if (path, problem) not in self._logged:
            self._logged.add((path, problem))
            log.warning("%r %s", path, problem)


def fingerprint(path: str) -> str:
    """A short hash of the names, sizes and modification times of the weight files directly
    in ``path`` (all its files if it has none). Stats only, never reads them, never through a
    link. Blocking."""
    files = sorted(
        (entry.name, entry.stat(follow_symlinks=False)) for entry in os.scandir(path)
        if not entry.name.startswith(".") and not entry.is_dir(follow_symlinks=False)
    )
    weights = [(name, st) for name, st in files if name.endswith(WEIGHT_SUFFIXES)] or files
    digest = hashlib.sha256()
    for name, st in weights:
        digest.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _quiet_since(path: str, since: float) -> bool:
    """True if ``path`` holds at least one file and nothing in it changed after ``since``."""
    has_files = False
    for st in _entries(path):
        has_files = has_files or not stat.S_ISDIR(st.st_mode)
        if st.st_mtime > since:
            return False
    return has_files


def _entries(path: str) -> Iterator[os.stat_result]:
    """The ``lstat`` of ``path`` and of everything under it; links are never followed."""
    yield os.lstat(path)
    stack = [path]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                yield entry.stat(follow_symlinks=False)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)

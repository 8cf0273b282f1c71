"""Finding checkpoints: the subdirectories of a directory whose names end in a step number.

A checkpoint is complete when it holds ``.complete``, or, with ``quiet_seconds``, when nothing
in it changed for that long (for trainers that write no marker). Scans poll: checkpoint dirs
often live on network filesystems, where inotify does not fire. Hidden directories (``.tmp-``
and the like) are never checkpoints.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from actorsys.staging import is_complete

STEP_SUFFIX = re.compile(r"(\d+)$")


@dataclass(frozen=True, order=True)
class Checkpoint:
    """``name``: the subdirectory's name (the ledger's key); ``path``: absolute."""

    step: int
    name: str
    path: str
    marked: bool


def step_of(name: str) -> int | None:
    """The step a directory name ends in (``step_120``, ``iter_0000120``, ``120``), or None."""
    if name.startswith("."):
        return None
    match = STEP_SUFFIX.search(name)
    return int(match.group(1)) if match else None


def scan(root: str, *, quiet_seconds: float | None = None, now: float) -> list[Checkpoint]:
    """The complete checkpoints under ``root``, by step (then name). ``now`` is the wall-clock
    time (``time.time()``) to judge ``quiet_seconds`` by. Blocking (reads the directory); a
    checkpoint removed while it is scanned is left out."""
    found: list[Checkpoint] = []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    for entry in entries:
        step = step_of(entry.name)
        if step is None or not entry.is_dir(follow_symlinks=True):
            continue
        path = os.path.abspath(entry.path)
        if is_complete(path):
            found.append(Checkpoint(step, entry.name, path, marked=True))
        elif quiet_seconds is not None and _quiet_since(path, now - quiet_seconds):
            found.append(Checkpoint(step, entry.name, path, marked=False))
    return sorted(found)


def _quiet_since(path: str, since: float) -> bool:
    """True if ``path`` holds at least one file and nothing in it changed after ``since``."""
    has_files = False
    try:
        for directory, _dirs, files in os.walk(path):
            has_files = has_files or bool(files)
            paths = [directory, *(os.path.join(directory, name) for name in files)]
            if any(os.stat(p).st_mtime > since for p in paths):
                return False
    except FileNotFoundError:
        return False
    return has_files

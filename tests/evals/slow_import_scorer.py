"""A scorer whose module takes ten minutes to import in a scoring worker (at once in the
test's own process): a worker being warmed with it is still starting when the test closes
its supervisor. Each worker that imports it first writes its pid into
:func:`importing_dir` of the process that spawned it."""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from pathlib import Path
from typing import Any


def importing_dir(parent: int) -> Path:
    return Path(tempfile.gettempdir()) / f"actorsys-slow-import-{parent}"


if multiprocessing.parent_process() is not None:
    directory = importing_dir(os.getppid())
    directory.mkdir(exist_ok=True)
    (directory / str(os.getpid())).write_text("")
    time.sleep(600)


def slow(answer: str, label: Any, record: Any) -> float:
    return float(answer == label)

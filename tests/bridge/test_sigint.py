"""Ctrl-C in a training process ends it within close_timeout (plus room for the interpreter's
exit on a loaded machine; the stuck evaluations would hold it forever), leaving no tmp dirs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from actorsys import staging

HOST = Path(__file__).with_name("sigint_host.py")
CLOSE_TIMEOUT = 2.0
EXIT_ROOM = 5.0


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_ctrl_c_during_training_exits_within_close_timeout(tmp_path: Path) -> None:
    staging_dir = tmp_path / "staging"
    host = subprocess.Popen(
        [sys.executable, str(HOST), str(staging_dir), str(CLOSE_TIMEOUT)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert host.stdout is not None
        assert host.stdout.readline().strip() == "training"
        interrupted = time.monotonic()
        host.send_signal(signal.SIGINT)
        output = host.communicate(timeout=CLOSE_TIMEOUT + 10)[0]
        elapsed = time.monotonic() - interrupted
    finally:
        host.kill()
        host.wait()
    assert elapsed < CLOSE_TIMEOUT + EXIT_ROOM
    assert host.returncode == -signal.SIGINT
    report = json.loads(output.strip().splitlines()[-1])
    assert report["abandoned"], "the stuck evaluations are cut off and named"
    assert staging.tmp_dirs(str(staging_dir)) == []

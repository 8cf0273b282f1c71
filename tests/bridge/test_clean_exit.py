"""A trainer that closes its bridge and exits at once exits 0: no thread of the pipeline is
left inside torch when the interpreter finalizes (that aborts the process with SIGABRT).

Real processes over a real ~1 GB model (random weights, saved here): with a base checkpoint
the bridge faults its buffer sets (about 2 GB) in from the start, so the exit comes while
that is under way. Before the buffer preparation stopped at close, most such runs aborted
(``bench/clean_exit.py`` counts them).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HOST = Path(__file__).with_name("exit_host.py")
RUNS = 3

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("bridge/test_clean_exit")]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("exit") / "base"
    subprocess.run([sys.executable, str(HOST), "make-base", str(path)], check=True, timeout=240)
    return path


def run_host(kind: str, base: Path, staging: Path, *options: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, str(HOST), "run", kind, str(base), str(staging), *options],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert "terminate called" not in done.stderr
    report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_process_exits_0_right_after_close_while_buffers_were_being_prepared(
    kind: str, base: Path, tmp_path: Path
) -> None:
    for run in range(RUNS):
        report = run_host(kind, base, tmp_path / f"staging-{run}")
        assert report == {"clean": True, "abandoned": [], "stuck_threads": []}


@pytest.mark.timeout(300)
def test_the_process_exits_0_after_a_close_that_left_an_export_running(
    base: Path, tmp_path: Path
) -> None:
    report = run_host("sync", base, tmp_path / "staging", "--source", "model",
                      "--close-timeout", "0")
    assert report["abandoned"] == [1] and report["clean"] is False

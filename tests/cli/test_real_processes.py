"""The commands as a user runs them: real processes, real engines, real training.

Slow (each starts engines): the demo with small settings (~30 s), a real ``watch`` that gets
SIGINT while it evaluates and is restarted (~30 s), and ``watch --once`` on two engines that
run anyway (~15 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.engine_process import engine_processes
from tests.fleet.conftest import corrupt_copy
from tests.models import PROMPTS, make_model, make_snapshot

CLOSE_TIMEOUT = 5.0
ENGINE_GRACE = 5.0
CHECKPOINTS = 8


def actorsys(*argv: str) -> list[str]:
    return [sys.executable, "-m", "actorsys", *argv]


def env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": root, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_demo_with_small_settings_learns_and_leaves_metrics_and_a_plot(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    run = subprocess.run(
        actorsys("demo", "--steps", "400", "--every", "200", "--engines", "1", "--out", str(out)),
        capture_output=True, text=True, timeout=230, env=env(),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    ok = {row["step"]: row["metrics"]["eval/addition"] for row in rows if row["status"] == "ok"}
    assert sorted(ok) == [200, 400]
    assert ok[400] > ok[200]
    assert (out / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "trainer stall per eval point" in run.stdout
    assert "blocking save_pretrained" in run.stdout


@pytest.fixture
def checkpoints(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "ckpt"
    make_model(root / "step_1", seed=1)
    for step in range(2, CHECKPOINTS + 1):
        make_snapshot(root / "step_1", root / f"step_{step}", seed=step)
    data = tmp_path / "tiny.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "label": "x"}) + "\n" for p in PROMPTS * 16))
    return root, data


def watch_command(root: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return actorsys(
        "watch", str(root), "--eval-prompt-data", "tiny", str(data), "--eval-max-response-len",
        "24", "--engines", "1", "--poll-interval", "0.5", "--eval-close-timeout",
        str(CLOSE_TIMEOUT), "--out", str(out), *extra,
    )


def done(out: Path) -> list[str]:
    lines = (out / "ledger.jsonl").read_text().splitlines()
    return [entry["checkpoint"] for entry in map(json.loads, lines) if entry["status"] == "ok"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigint_stops_watch_within_the_close_timeout_and_a_restart_resumes(
    checkpoints: tuple[Path, Path], tmp_path: Path
) -> None:
    root, data = checkpoints
    out = tmp_path / "out"
    watch = subprocess.Popen(
        watch_command(root, data, out), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, env=env(),
    )
    try:
        assert watch.stdout is not None
        first = watch.stdout.readline()
        assert first.startswith("step 1: ok"), first
        interrupted = time.monotonic()
        watch.send_signal(signal.SIGINT)
        returncode = watch.wait(timeout=CLOSE_TIMEOUT + ENGINE_GRACE + 20)
        stopped_after = time.monotonic() - interrupted
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert returncode == 130
    assert stopped_after < CLOSE_TIMEOUT + ENGINE_GRACE
    before = done(out)
    assert before[0] == "step_1" and len(before) < CHECKPOINTS

    tensorboard = tmp_path / "tb"
    resumed = subprocess.run(watch_command(root, data, out, "--once", "--tensorboard", str(tensorboard)),
                             capture_output=True, text=True, timeout=200, env=env())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = done(out)
    assert sorted(after, key=lambda name: int(name.split("_")[1])) == [
        f"step_{step}" for step in range(1, CHECKPOINTS + 1)
    ]
    assert len(after) == len(set(after))
    assert after[: len(before)] == before
    events = EventAccumulator(str(tensorboard))
    events.Reload()
    resumed_steps = [int(name.split("_")[1]) for name in after[len(before):]]
    assert [e.step for e in events.Scalars("eval/tiny")] == resumed_steps


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_watch_once_on_two_engine_urls_uses_both_lands_in_step_order_and_fails_a_poison_one(
    checkpoints: tuple[Path, Path], tmp_path: Path
) -> None:
    root, data = checkpoints
    corrupt_copy(root / "step_2", root / f"step_{CHECKPOINTS + 1}")
    logs = [tmp_path / f"engine-{i}.log" for i in range(2)]
    argvs = [["--model", str(root / "step_1")]] * 2
    with engine_processes(argvs, logs=logs) as urls:
        out = tmp_path / "out"
        run = subprocess.run(
            actorsys("watch", str(root), "--eval-prompt-data", "tiny", str(data),
                     "--eval-max-response-len", "8", "--engine-url", *urls, "--once",
                     "--max-attempts", "2", "--out", str(out)),
            capture_output=True, text=True, timeout=120, env=env(),
        )
    assert run.returncode == 1, run.stderr[-3000:]
    assert done(out) == [f"step_{step}" for step in range(1, CHECKPOINTS + 1)]
    entries = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    poison = [e["status"] for e in entries if e["step"] == CHECKPOINTS + 1]
    assert poison == ["skipped", "skipped", "failed"]
    assert f"1 failed [{CHECKPOINTS + 1}]" in run.stdout
    for log in logs:
        assert "loaded" in log.read_text()



"""``actorsys watch --once`` as a user runs it, on a real CPU engine, over the output of a real
``transformers.Trainer`` run: its ``checkpoint-N`` directories need no ``--quiet-seconds``,
and ``--marker STABLE`` takes only the marked ones."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_real_processes import actorsys, env
from tests.models import PROMPTS
from tests.watch.trainer_run import train_with_checkpoints


def evaluated_ok(out: Path) -> list[str]:
    entries = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    return [entry["checkpoint"] for entry in entries if entry["status"] == "ok"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_watch_once_over_a_trainers_output_evaluates_its_checkpoints_and_marker_narrows_it(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    assert train_with_checkpoints(run, steps=6, save_steps=2) == [
        "checkpoint-2", "checkpoint-4", "checkpoint-6"
    ]
    data = tmp_path / "tiny.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "label": "x"}) + "\n" for p in PROMPTS))
    out = tmp_path / "out"

    def watch(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            actorsys("watch", str(run), "--eval-prompt-data", "tiny", str(data),
                     "--eval-max-response-len", "4", "--engines", "1", "--once", "--out",
                     str(out), *extra),
            capture_output=True, text=True, timeout=250, env=env(),
        )

    (run / "checkpoint-4" / "STABLE").write_bytes(b"")
    marked = watch("--marker", "STABLE")
    assert marked.returncode == 0, marked.stderr[-3000:]
    assert evaluated_ok(out) == ["checkpoint-4"]
    assert "step 4: ok" in marked.stdout

    rest = watch()
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert evaluated_ok(out) == ["checkpoint-4", "checkpoint-2", "checkpoint-6"]
    assert "evaluated 2 checkpoints ok" in rest.stdout

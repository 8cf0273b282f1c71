"""The trainer examples run end to end: a transformers Trainer, TRL's GRPOTrainer and a
Lightning run each evaluate every K steps and hold the scores at their steps when they exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("script", "library", "steps", "every"), [
    ("train_hf_trainer.py", "transformers", 30, 10),
    ("train_trl_grpo.py", "trl", 6, 3),
    ("train_lightning.py", "lightning", 30, 10),
])
def test_trainer_example_logs_every_point_at_its_step(
    script: str, library: str, steps: int, every: int, tmp_path: Path
) -> None:
    pytest.importorskip(library)
    results = tmp_path / "results.json"
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--steps", str(steps), "--eval-every", str(every),
         "--workdir", str(tmp_path), "--results", str(results)],
        capture_output=True, text=True, timeout=280,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(results.read_text())
    expected = list(range(every, steps + 1, every))
    assert sorted(o["step"] for o in report["outcomes"] if o["status"] == "ok") == expected
    rows = report["eval_rows"]
    assert sorted(int(float(row["eval/step"])) for row in rows) == expected
    assert all(float(row["eval/perplexity"]) > 1 for row in rows)

"""The Ray trainer example end to end: 2 training workers each write their shard of every
checkpoint, the Exporter publishes it, an engine actor serves it, the score is recorded (on the
Ray tests' local cluster, ``ray_cluster``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fleet.ray_cluster import RAY_TIER

pytest.importorskip("ray")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ray.py"
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


pytestmark = RAY_TIER


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ray_trainer_exports_shards_from_both_workers_and_evaluates_them_on_ray(
    tmp_path: Path, ray_cluster: Any
) -> None:
    results = tmp_path / "results.json"
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "20", "--eval-every", "10",
         "--ray-address", ray_cluster.address,
         "--workdir", str(tmp_path), "--eval-keep-snapshots", "1", "--results", str(results)],
        capture_output=True, text=True, timeout=280,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(results.read_text())
    outcomes = {o["step"]: o for o in report["outcomes"]}
    assert sorted(outcomes) == [0, 10, 20]
    assert all(o["status"] == "ok" for o in outcomes.values()), outcomes
    for step in (10, 20):
        files = outcomes[step]["data"]["files"]
        assert [f for f in files if f.endswith(".safetensors")] == SHARDS
        assert {".complete", "model.safetensors.index.json", "config.json"} <= set(files)
        assert outcomes[step]["weight_version"] == str(step)
    accuracy = {step: o["metrics"]["eval/next_words_acc"] for step, o in outcomes.items()}
    assert accuracy[20] > accuracy[0]
    assert report["close"]["clean"]
    assert sorted(p.name for p in (tmp_path / "staging").iterdir()) == ["journal.jsonl", "step_20"]

"""The training examples run end to end: real torch training, real exports loaded back by
transformers, scores recorded at their steps, a clean exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("script", ["train_sync.py", "train_asyncio.py"])
def test_example_evaluates_every_k_steps_and_exits_cleanly(script: str, tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--steps", "30", "--eval-every", "10",
         "--workdir", str(tmp_path), "--eval-keep-snapshots", "1", "--results", str(results)],
        capture_output=True, text=True, timeout=170,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(results.read_text())
    outcomes = {o["step"]: o for o in report["outcomes"]}
    assert sorted(outcomes) == [10, 20, 30]
    assert all(o["status"] == "ok" for o in outcomes.values())
    assert outcomes[30]["metrics"]["eval/loss"] < outcomes[10]["metrics"]["eval/loss"]
    assert outcomes[30]["weight_version"] == "30"
    assert report["close"]["clean"]
    assert sorted(p.name for p in (tmp_path / "staging").iterdir()) == ["journal.jsonl", "step_30"]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_fsdp_example_evaluates_the_sharded_model_on_the_evaluating_rank(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_fsdp.py"), "--steps", "20", "--eval-every", "10",
         "--workdir", str(tmp_path), "--eval-keep-snapshots", "1", "--results", str(results)],
        capture_output=True, text=True, timeout=410,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(results.read_text())
    outcomes = {o["step"]: o for o in report["outcomes"]}
    assert sorted(outcomes) == [10, 20]
    assert all(o["status"] == "ok" for o in outcomes.values())
    assert outcomes[20]["metrics"]["eval/loss"] < outcomes[10]["metrics"]["eval/loss"]
    assert report["close"]["clean"]
    assert sorted(p.name for p in (tmp_path / "staging").iterdir()) == ["journal.jsonl", "step_20"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_chat_example_scores_the_same_in_the_trainer_and_in_watch(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "chat_eval.py"), "--steps", "30", "--eval-every", "30",
         "--workdir", str(tmp_path), "--results", str(results)],
        capture_output=True, text=True, timeout=590,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(results.read_text())
    assert report["trainer"] == report["watch"]
    assert report["trainer"]["0"] == {"think": 0.0, "direct": 0.0}
    assert report["trainer"]["30"] == {"think": 1.0, "direct": 1.0}
    assert report["prompt"].startswith("<|bos|><|im_start|>system\n")
    assert report["close_clean"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_shared_fleet_example_scores_each_served_point_on_the_weights_synced_at_its_step(
    tmp_path: Path,
) -> None:
    results = tmp_path / "results.json"
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_shared_fleet.py"), "--steps", "8",
         "--eval-every", "4", "--workdir", str(tmp_path), "--results", str(results)],
        capture_output=True, text=True, timeout=290,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    outcomes = {o["step"]: o for o in json.loads(results.read_text())["outcomes"]}
    assert sorted(outcomes) == [4, 8]
    for step, outcome in outcomes.items():
        assert outcome["status"] == "ok", (outcome["reason"], outcome["data"])
        assert outcome["snapshot"] is None and outcome["weight_version"] == str(step)
    assert "rollouts answered meanwhile" in run.stdout
    # nothing was exported: the staging dir holds the journal only
    assert sorted(p.name for p in (tmp_path / "staging").iterdir()) == ["journal.jsonl"]

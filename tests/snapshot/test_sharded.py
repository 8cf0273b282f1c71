"""Sharded models across real gloo ranks on CPU: each rank a spawned process (see
``sharded_ranks.py``), a tiny Llama sharded with FSDP2, every rank submitting it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

pytestmark = [pytest.mark.slow]

WORKER = str(Path(__file__).with_name("sharded_ranks.py"))
ROOT = str(Path(__file__).resolve().parents[2])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(
    tmp_path: Path, *, world: int, cases: list[str], steps: int, init: str | None = None,
    limit: float = 150,
) -> dict[str, dict[int, Any]]:
    """Run every rank through ``cases`` in turn; return each case's record of each rank (a
    rank that died has none)."""
    init = init or f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    argv = [str(world), init, str(tmp_path), ",".join(cases), str(steps)]
    procs = [
        subprocess.Popen([sys.executable, WORKER, str(rank), *argv], env=env)
        for rank in range(world)
    ]
    deadline = time.monotonic() + limit
    try:
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    records: dict[str, dict[int, Any]] = {case: {} for case in cases}
    for case in cases:
        for rank in range(world):
            path = tmp_path / case / f"rank{rank}.json"
            if path.exists():
                records[case][rank] = json.loads(path.read_text())
    return records


def snapshot_tensors(directory: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(directory / name))
    return tensors


@pytest.mark.timeout(330)
def test_snapshots_of_a_sharded_model_equal_save_pretrained_of_the_unsharded_one(
    tmp_path: Path,
) -> None:
    """Four ranks (uneven shards of every tensor whose rows 4 does not divide, three
    contributors), a tied and an untied model in turn, each through its own bridge."""
    world, steps = 4, 2
    jobs = run_job(tmp_path, world=world, cases=["tied", "untied"], steps=steps, limit=300)
    for case, records in jobs.items():
        assert sorted(records) == list(range(world)), case
        for record in records.values():
            assert record["submits"] == {str(s): True for s in range(1, steps + 1)}
            assert record["drain"]["pending"] == []
        outcomes = records[0]["outcomes"]
        assert [o["status"] for o in outcomes] == ["ok"] * steps, (case, outcomes)
        for rank in range(1, world):
            assert records[rank]["outcomes"] == []
        out = tmp_path / case
        for step in range(1, steps + 1):
            snapshot = out / "hf" / f"step_{step}"
            got, want = snapshot_tensors(snapshot), snapshot_tensors(out / "reference" / str(step))
            assert sorted(got) == sorted(want)
            assert ("lm_head.weight" in got) is (case == "untied")
            for name, tensor in want.items():
                assert torch.equal(got[name], tensor), (case, name)
            config = json.loads((snapshot / "config.json").read_text())
            assert config["architectures"] == ["LlamaForCausalLM"]
        first, second = (snapshot_tensors(out / "hf" / f"step_{s}") for s in (1, 2))
        assert not torch.equal(first["model.embed_tokens.weight"], second["model.embed_tokens.weight"])


@pytest.mark.timeout(150)
def test_a_contributor_killed_mid_submit_skips_the_point_without_hanging_the_evaluator(
    tmp_path: Path,
) -> None:
    records = run_job(tmp_path, world=2, cases=["kill-contributor"], steps=1)["kill-contributor"]
    assert sorted(records) == [0]
    evaluator = records[0]
    assert evaluator["submits"] == {"1": True}
    [outcome] = evaluator["outcomes"]
    assert (outcome["status"], outcome["reason"]) == ("skipped", "export_failed")
    assert "rank 1" in outcome["error"]
    assert evaluator["drain"]["pending"] == []
    assert evaluator["seconds"] < 60
    assert not (tmp_path / "kill-contributor" / "hf" / "step_1").exists()


@pytest.mark.timeout(150)
def test_a_dead_evaluating_rank_is_a_skip_on_the_others_after_the_collective_timeout(
    tmp_path: Path,
) -> None:
    init = f"file://{tmp_path / 'store'}"
    records = run_job(tmp_path, world=2, cases=["kill-evaluator"], steps=2, init=init)["kill-evaluator"]
    assert sorted(records) == [1]
    contributor = records[1]
    assert contributor["submits"] == {"1": True, "2": False}
    assert contributor["outcomes"] == []
    assert contributor["seconds"] < 60

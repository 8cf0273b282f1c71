"""Under overflow="skip" a submit costs the host at most the weight copy plus a small constant,
however long the evaluations in flight hang (real thread and model; the measured numbers are
in bench/close_bound.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from hangs import SCENARIOS

from actorsys import EvalConfig
from actorsys.snapshot import capture
from bridge import EvalBridge

CONSTANT = 0.5


def bare_copy_seconds(model: torch.nn.Module, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        capture(model)
        times.append(time.perf_counter() - started)
    return max(times)


@pytest.mark.timeout(60)
def test_skip_submits_never_wait_on_a_hanging_eval(tmp_path: Path) -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])
    copy = bare_copy_seconds(model)
    config = EvalConfig(hf_dir=tmp_path / "staging", overflow="skip", max_in_flight=2)
    latencies, admitted = [], []
    with SCENARIOS["trio_eval_never_returns"]() as eval_fn, EvalBridge(
        config, eval_fn=eval_fn
    ) as bridge:
        for step in range(40):
            started = time.perf_counter()
            admitted.append(bridge.submit(step, model=model))
            latencies.append(time.perf_counter() - started)
            if step == 0:
                assert eval_fn.entered.wait(10)
        statistics = bridge.statistics()
        bridge.close(timeout=2)
    assert admitted[:2] == [True, True]
    assert not any(admitted[2:])
    assert statistics.skipped_by_reason == {"busy": 38}
    assert max(latencies) < 3 * copy + CONSTANT

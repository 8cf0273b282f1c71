"""Under overflow="skip" a submit never waits on the evaluations in flight, however long they
hang (real thread and model): every submit past the limit returns, refused as busy. What a
submit costs the host is measured in bench/close_bound.py (part 2), not timed here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hangs import SCENARIOS

from actorsys import EvalConfig
from bridge import EvalBridge


@pytest.mark.timeout(60)
def test_skip_submits_never_wait_on_a_hanging_eval(tmp_path: Path) -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(2)])
    config = EvalConfig(hf_dir=tmp_path / "staging", overflow="skip", max_in_flight=2)
    admitted = []
    with SCENARIOS["trio_eval_never_returns"]() as eval_fn, EvalBridge(
        config, eval_fn=eval_fn
    ) as bridge:
        for step in range(40):
            admitted.append(bridge.submit(step, model=model))
            if step == 0:
                assert eval_fn.entered.wait(10)
        statistics = bridge.statistics()
        bridge.close(timeout=2)
    assert admitted[:2] == [True, True]
    assert not any(admitted[2:])
    assert statistics.skipped_by_reason == {"busy": 38}

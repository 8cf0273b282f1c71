"""A Ray driver (an asyncio loop that also blocks on ``ray.get``) evaluates through
AsyncEvalBridge and exits cleanly. Needs the ``ray`` extra; the driver joins the Ray tests'
local cluster (``ray_cluster``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fleet.ray_cluster import RAY_TIER

pytest.importorskip("ray")

DRIVER = Path(__file__).with_name("ray_driver.py")


pytestmark = RAY_TIER


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_ray_driver_evaluates_through_the_async_bridge(tmp_path: Path, ray_cluster: Any) -> None:
    run = subprocess.run(
        [sys.executable, str(DRIVER), str(tmp_path / "staging"), ray_cluster.address],
        capture_output=True, text=True, timeout=230,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    outcomes = {o["step"]: o for o in result["outcomes"]}
    assert sorted(outcomes) == [2, 4, 6]
    assert all(o["status"] == "ok" for o in outcomes.values())
    assert all(o["metrics"]["eval/weight_norm"] > 0 for o in outcomes.values())
    assert result["close"]["clean"]
    assert result["loops"][0] == result["loops"][1]
    assert result["policies"][0] == result["policies"][1]

"""Ray is an optional extra: actorsys, the bridge and even ``actorsys.fleet.ray`` import
without it; Ray is needed only once a fleet is opened."""

from __future__ import annotations

import subprocess
import sys

import pytest

WITHOUT_RAY = """
import sys
sys.modules["ray"] = None  # any `import ray` now raises ImportError
import actorsys, actorsys.fleet, actorsys.fleet.local, actorsys.fleet.ray, bridge
print("imported")
"""


@pytest.mark.timeout(60)
def test_actorsys_imports_without_ray() -> None:
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY], capture_output=True, text=True, timeout=50
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "imported"

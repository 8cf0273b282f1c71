"""The trainer libraries are optional: actorsys imports without TRL and Lightning, the
transformers callback without Lightning, and the Lightning one says which extra it needs."""

from __future__ import annotations

import subprocess
import sys

import pytest

WITHOUT_TRAINERS = """
import sys
sys.modules["lightning"] = None  # any `import lightning` now raises ImportError
sys.modules["trl"] = None
import actorsys, bridge, actorsys.integrations, actorsys.integrations.transformers
try:
    import actorsys.integrations.lightning
except ImportError as exc:
    print("lightning:", exc)
print("imported")
"""


@pytest.mark.timeout(60)
def test_actorsys_imports_without_trl_and_lightning() -> None:
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT_TRAINERS], capture_output=True, text=True, timeout=50
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines() == [
        "lightning: actorsys.integrations.lightning needs lightning: pip install "
        "'actorsys[lightning]'",
        "imported",
    ]

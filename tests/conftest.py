from __future__ import annotations

import os

# Nothing is fetched from a hub in tests: models and datasets are made here. These are read
# when huggingface_hub and datasets are imported, so they are set before anything imports them.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from actorsys import EvalConfig, MemorySink  # noqa: E402

# One intra-op thread in the test process, as the engines it starts use (``engine --threads``
# defaults to 1): on two cores, torch's OpenMP workers spin against the engines and the other
# tests' processes, and a loop of small matmuls slows tenfold when the machine is busy.
torch.set_num_threads(1)


@pytest.fixture
def staging(tmp_path: Path) -> Path:
    path = tmp_path / "staging"
    path.mkdir()
    return path


@pytest.fixture
def sink() -> MemorySink:
    return MemorySink()


@pytest.fixture
def config_for(staging: Path):  # type: ignore[no-untyped-def]
    def make(**overrides: object) -> EvalConfig:
        return EvalConfig(hf_dir=staging, **overrides)  # type: ignore[arg-type]

    return make


def snapshot_dirs(staging: Path) -> list[str]:
    return sorted(name for name in os.listdir(staging) if name.startswith("step_"))


def tmp_dirs(staging: Path) -> list[str]:
    return sorted(name for name in os.listdir(staging) if name.startswith(".tmp-"))

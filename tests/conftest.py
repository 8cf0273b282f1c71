from __future__ import annotations

import os
from pathlib import Path

import pytest

from actorsys import EvalConfig, MemorySink


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

"""Fixtures for the bridge tests: a plain checkpoint dir, and no bridge thread left behind."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

BRIDGE_THREAD = "actorsys-bridge"


@pytest.fixture
def checkpoint_dir(tmp_path: Path) -> str:
    """An existing directory to submit with ``checkpoint_dir=`` (no export involved)."""
    path = tmp_path / "ckpt"
    path.mkdir()
    return str(path)


@pytest.fixture(autouse=True)
def no_bridge_thread_left() -> Iterator[None]:
    """After a test (and its scenario's clean-up), every bridge thread must end."""
    yield
    for thread in threading.enumerate():
        if thread.name.startswith(BRIDGE_THREAD):  # the trio thread and its relay
            thread.join(10)
            assert not thread.is_alive(), "a bridge thread outlived its test"

from __future__ import annotations

import errno
import shutil
import signal
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio

from tests.models import make_model, make_snapshot

if TYPE_CHECKING:
    from actorsys.fleet.local.engine import LocalEngine
    from tests.fleet.vllm_server import SharedServers, SharedVLLM

VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
VLLM_TIER = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.xdist_group("vllm"),
    pytest.mark.skipif(
        not VLLM_PYTHON.exists(),
        reason="vLLM tier: .venv-vllm is missing; run scripts/setup_vllm.sh to set it up",
    ),
]
"""The marks of a module that drives a real vLLM server from ``.venv-vllm``: its tests run in
the test command's vLLM lane (one worker, one after another: each server takes a core-bound
start and GiBs of memory)."""


@dataclass(frozen=True)
class TinyModels:
    """A served base model and two snapshots of its architecture (read-only for tests)."""

    base: Path
    step1: Path
    step2: Path
    other_arch: Path


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    root = tmp_path_factory.mktemp("tiny")
    make_model(root / "base", seed=0)
    make_snapshot(root / "base", root / "step1", seed=1)
    make_snapshot(root / "base", root / "step2", seed=2)
    make_model(root / "other", seed=3, hidden=96, layers=1)
    return TinyModels(root / "base", root / "step1", root / "step2", root / "other")


@pytest.fixture(scope="session")
def tied(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    """Like ``tiny``, with tied embeddings (the checkpoints hold no ``lm_head.weight``)."""
    root = tmp_path_factory.mktemp("tied")
    make_model(root / "base", seed=10, tied=True)
    make_snapshot(root / "base", root / "step1", seed=11)
    make_snapshot(root / "base", root / "step2", seed=12)
    make_model(root / "other", seed=13, hidden=96, layers=1, tied=True)
    return TinyModels(root / "base", root / "step1", root / "step2", root / "other")


@pytest.fixture(scope="session")
def moe(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    """Like ``tiny``, a tiny Qwen3-MoE (4 experts, tied embeddings): the checkpoints hold
    per-expert tensors, which transformers fuses into one tensor per layer at load."""
    root = tmp_path_factory.mktemp("moe")
    make_model(root / "base", seed=20, moe=True)
    make_snapshot(root / "base", root / "step1", seed=21)
    make_snapshot(root / "base", root / "step2", seed=22)
    make_model(root / "other", seed=23, hidden=96, moe=True)
    return TinyModels(root / "base", root / "step1", root / "step2", root / "other")


@pytest.fixture(scope="session")
def vllm_servers() -> Iterator[SharedServers]:
    """The vLLM servers the lane's tests share (tests/fleet/vllm_server.py); each starts at its
    first use and stops after the last of consecutive tests that ask for it or, at the latest,
    with the session."""
    from tests.fleet.vllm_server import SERVERS

    yield SERVERS
    SERVERS.keep_only(())


@pytest.fixture
def tiny_vllm(vllm_servers: SharedServers, tiny: TinyModels) -> SharedVLLM:
    """A vLLM server, shared, started on ``tiny.base`` (untied; worker extension, key)."""
    return vllm_servers.get(tiny.base, "tiny_vllm")


@pytest.fixture
def tied_vllm(vllm_servers: SharedServers, tied: TinyModels) -> SharedVLLM:
    """A vLLM server, shared, started on ``tied.base`` (tied embeddings)."""
    return vllm_servers.get(tied.base, "tied_vllm")


@pytest.fixture
def moe_vllm(vllm_servers: SharedServers, moe: TinyModels) -> SharedVLLM:
    """A vLLM server, shared, started on ``moe.base`` (the tiny Qwen3-MoE)."""
    return vllm_servers.get(moe.base, "moe_vllm")


def corrupt_copy(source: Path, target: Path) -> Path:
    """A copy of ``source`` whose safetensors header is garbage (the data is intact)."""
    shutil.copytree(source, target)
    weights = target / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:40] = b"\x00not a json header, corrupted!!\x00"
    weights.write_bytes(bytes(data))
    return target


async def kill_and_see_the_port_held(engine: LocalEngine, restart_seconds: float) -> None:
    """SIGKILL a local fleet's ``engine`` (its whole process group); while the fleet restarts
    it, its port cannot be bound by anyone else; return once it runs again."""
    engine.process.signal_group(signal.SIGKILL)
    await engine.process.wait()
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with pytest.raises(OSError, match="in use") as taken:
            squatter.bind(("127.0.0.1", engine.port))
    assert taken.value.errno == errno.EADDRINUSE
    with trio.fail_after(restart_seconds):
        await engine.wait_state("running", restarts=1)


Handler = Callable[[httpx.Request], Any]


class Recorder:
    """An httpx MockTransport whose handler is swapped by the test; records every request."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[httpx.Request] = []
        self.transport = httpx.MockTransport(self._handle)

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        result = self.handler(request)
        if hasattr(result, "__await__"):
            result = await result
        assert isinstance(result, httpx.Response)
        return result

    def paths(self) -> list[str]:
        return [f"{r.method} {r.url.path}" for r in self.requests]

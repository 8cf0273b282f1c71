from __future__ import annotations

import os
import sys

# Nothing is fetched from a hub in tests: models and datasets are made here. These are read
# when huggingface_hub and datasets are imported, so they are set before anything imports them.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from actorsys import EvalConfig, MemorySink  # noqa: E402
from tests.fleet.ray_cluster import SharedCluster  # noqa: E402

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


def lane(nodeid: str) -> str:
    """The pytest-xdist work unit of the test ``nodeid`` (``--dist loadfile`` as the test
    command runs it): its file, so that a module's module- and session-scoped fixtures start
    once on one worker; but every file that starts a Ray cluster (``ray`` in its name) shares
    one lane, and so does every file that starts vLLM (``vllm`` in its name), so that two of
    either never run at once (each takes a core-bound start and GiBs of memory)."""
    path = nodeid.split("::", 1)[0]
    name = path.rsplit("/", 1)[-1]
    for tier in ("vllm", "ray"):
        if tier in name:
            return tier
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile`` schedules by :func:`lane`; any other mode is xdist's own."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Lanes(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            # The two long lanes first, so that neither is what the run waits for at its end.
            for tier in ("ray", "vllm"):
                if tier in self.workqueue:
                    self.workqueue.move_to_end(tier, last=False)
            super()._assign_work_unit(node)

    return Lanes(config, log)  # type: ignore[arg-type]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked ``ray`` or ``vllm`` lives in a file that :func:`lane` puts in that lane."""
    for item in items:
        for tier in ("vllm", "ray"):
            if item.get_closest_marker(tier) is not None and lane(item.nodeid) != tier:
                raise pytest.UsageError(
                    f"{item.nodeid} is marked {tier} but its file name lacks {tier!r}: the "
                    f"test command's workers would run it beside another {tier} test"
                )


_ray_cluster = SharedCluster()


@pytest.fixture
def ray_cluster() -> Any:
    """The Ray tests' local cluster (``ray_cluster.LANE_NODES``), this process's driver
    connected to it: started by the first test that asks for it and shared by the Ray tests
    that follow it (the test command runs them in a row, see ``lane``), stopped after the
    last of them. A test that removes a node adds one back."""
    return _ray_cluster.get()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """What the lanes share stops as soon as the next test does not need it, rather than
    holding its memory until the session ends: a vLLM server the vLLM lane's tests share
    (tests/fleet/vllm_server.py) once the next test does not ask for it (the tests that share
    one are neighbours in the lane's order), the Ray cluster once the next test is not in the
    Ray lane."""
    shared = sys.modules.get("tests.fleet.vllm_server")
    if shared is not None:
        shared.SERVERS.keep_only(getattr(nextitem, "fixturenames", ()))
    if nextitem is None or lane(nextitem.nodeid) != "ray":
        _ray_cluster.stop()


def pytest_sessionfinish() -> None:
    _ray_cluster.stop()

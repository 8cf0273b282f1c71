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


LANES = ("ray", "vllm")
"""The long lanes: every module that starts a Ray cluster (``RAY_TIER``) or a vLLM server
(``VLLM_TIER``) puts its tests in the ``xdist_group`` of that name, so that under the test
command's ``--dist loadgroup`` two of either never run at once (each takes a core-bound start
and GiBs of memory). A module whose module-scoped fixture is expensive (an engine process, a
training run) is a group of its own, named by its file, so the fixture starts on one worker;
every other test is scheduled on its own."""


def group(item: pytest.Item) -> str | None:
    """The ``xdist_group`` of ``item``, if it has one."""
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return None
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``ray`` or ``vllm`` is in the lane of that name; the Ray lane's tests come
    first, then the vLLM lane's, so that with ``--no-loadscope-reorder`` xdist hands the two
    long lanes out first, to two workers, and neither is what the run waits for at its end.
    The order is otherwise kept (the tests that share a vLLM server stay neighbours)."""
    if config.getvalue("loadgroup") if hasattr(config.option, "loadgroup") else False:
        keep_groups(items)
    for item in items:
        for tier in LANES:
            if item.get_closest_marker(tier) is not None and group(item) != tier:
                raise pytest.UsageError(
                    f"{item.nodeid} is marked {tier} but not xdist_group({tier!r}): the test "
                    f"command's workers would run it beside another {tier} test"
                )
    rank = {tier: index for index, tier in enumerate(LANES)}
    items.sort(key=lambda item: rank.get(group(item) or "", len(LANES)))


def keep_groups(items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` each worker names a grouped test ``<id>@<group>`` (the
    scheduler reads the group from there). pytest-xdist 3.8 writes that name into a field
    pytest 9.2 no longer reads, so on pytest 9.2 every group would silently be scheduled test
    by test; this writes it where pytest 9.2 keeps a node's id, where xdist did not already.
    Runs after xdist's own hook (``trylast``)."""
    from _pytest.nodeid import coerce_node_id

    for item in items:
        name = group(item)
        if name is not None and not item.nodeid.endswith(f"@{name}"):
            item._id = coerce_node_id(f"{item.nodeid}@{name}")  # type: ignore[attr-defined]


_ray_cluster = SharedCluster()


@pytest.fixture
def ray_cluster() -> Any:
    """The Ray tests' local cluster (``ray_cluster.LANE_NODES``), this process's driver
    connected to it: started by the first test that asks for it and shared by the Ray tests
    that follow it (the test command runs them in a row, see ``LANES``), stopped after the
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
    if nextitem is None or group(nextitem) != "ray":
        _ray_cluster.stop()


def pytest_sessionfinish() -> None:
    _ray_cluster.stop()

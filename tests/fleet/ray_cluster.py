"""A local multi-node Ray cluster for tests and benches (``ray.cluster_utils.Cluster``):
every node is its own raylet on this machine, with the resources it is given.

Starting a head writes Ray's "current cluster" file, which a bare ``ray.init()`` elsewhere
on the machine would connect to; the file is put back as it was when the cluster stops.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

RAY_TIER = [pytest.mark.ray, pytest.mark.slow, pytest.mark.xdist_group("ray")]
"""The marks of a module that starts a Ray cluster: its tests run in the test command's Ray
lane (one worker, one after another, sharing the cluster the root conftest keeps)."""

NODE_MEMORY = 80 * 1024 * 1024

SLOT = "engine_slot"
"""A custom resource each node of :data:`LANE_NODES` has one of: engines that ask for it are
placed one per node, and one whose node is gone waits for a new node."""

LANE_NODES: tuple[dict[str, Any], ...] = (
    {"num_cpus": 2, "num_gpus": 2, "resources": {SLOT: 1}},
    {"num_cpus": 2, "resources": {SLOT: 1}},
    {"num_cpus": 2, "resources": {SLOT: 1}},
)
"""The Ray tests' cluster: head A (2 CPUs, 2 declared GPUs) and workers B and C (2 CPUs), one
engine slot each."""


@contextmanager
def local_cluster(*nodes: dict[str, Any]) -> Iterator[Any]:
    """A cluster whose head is ``nodes[0]`` and whose workers are the rest (keyword
    arguments of ``Cluster.add_node``), with this process's driver connected to it."""
    import ray
    from ray._common.utils import get_ray_address_file
    from ray.cluster_utils import Cluster

    address_file = get_ray_address_file(None)
    before = open(address_file).read() if os.path.exists(address_file) else None
    head, *workers = nodes
    cluster = Cluster(initialize_head=True, head_node_args={
        "include_dashboard": False, "object_store_memory": NODE_MEMORY, **head})
    try:
        for node in workers:
            cluster.add_node(object_store_memory=NODE_MEMORY, **node)
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        try:
            yield cluster
        finally:
            ray.shutdown()
    finally:
        cluster.shutdown()
        if before is None:
            if os.path.exists(address_file):
                os.remove(address_file)
        else:
            with open(address_file, "w") as f:
                f.write(before)


def add_node(cluster: Any, **node: Any) -> Any:
    return cluster.add_node(object_store_memory=NODE_MEMORY, **node)


class SharedCluster:
    """One :func:`local_cluster` of :data:`LANE_NODES` for consecutive tests: started by the
    first :meth:`get`, stopped by :meth:`stop` (a cluster start is seconds of CPU)."""

    def __init__(self) -> None:
        self._stack: ExitStack | None = None
        self._cluster: Any = None

    def get(self) -> Any:
        if self._stack is None:
            with ExitStack() as stack:
                self._cluster = stack.enter_context(local_cluster(*LANE_NODES))
                self._stack = stack.pop_all()
        return self._cluster

    def stop(self) -> None:
        stack, self._stack, self._cluster = self._stack, None, None
        if stack is not None:
            stack.close()

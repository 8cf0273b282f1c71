"""A local multi-node Ray cluster for tests and benches (``ray.cluster_utils.Cluster``):
every node is its own raylet on this machine, with the resources it is given.

Starting a head writes Ray's "current cluster" file, which a bare ``ray.init()`` elsewhere
on the machine would connect to; the file is put back as it was when the cluster stops.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

NODE_MEMORY = 80 * 1024 * 1024


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

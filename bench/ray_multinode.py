"""RayFleet on one node against RayFleet spread over three: a local multi-node Ray cluster
(three raylets on this machine), three engines either all on one node or one per node
(``scheduling_strategy="SPREAD"``), the same points through EvalSupervisor on each.

Run: ``.venv/bin/python bench/ray_multinode.py [--points 6]``

Prints the time until the three engines serve, and per point (alternating two snapshots as
``checkpoint_dir``, so every pin loads new weights) the median pin
(``eval/pin_time_seconds``: all three engines load and read back, then the weight probe) and
the whole point. The nodes share this machine's cores, so the figures show what placement
and Ray's routing across raylets cost, not the bandwidth of a real network.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ray_fleet import ms, point_times  # noqa: E402

from actorsys.fleet.ray import RayFleet, await_ref  # noqa: E402
from tests.fleet.ray_cluster import local_cluster  # noqa: E402
from tests.models import make_model, make_snapshot  # noqa: E402

NODES = 3
PLACEMENTS: dict[str, dict[str, Any]] = {
    "1 node": {"num_cpus": 0.1, "resources": {"node_0": 1}},
    "3 nodes": {"num_cpus": 0.1, "resources": {"slot": 1}, "scheduling_strategy": "SPREAD"},
}


async def measure(base: str, snapshots: list[str], points: int) -> None:
    rows = []
    for label, resources in PLACEMENTS.items():
        started = time.monotonic()
        async with RayFleet.open(base, num_engines=3, resources=resources) as ray_fleet:
            serving = time.monotonic() - started
            nodes = {await await_ref(actor.node_id.remote()) for actor in ray_fleet.actors}
            pin, whole = await point_times(ray_fleet.fleet, snapshots, points)
        rows.append((label, len(nodes), serving, pin, whole))
    print(f"3 engines, median over {points} points   nodes used   serving after      pin    whole point")
    for label, used, serving, pin, whole in rows:
        print(f"  {label:<34} {used:>5}      {serving:8.2f} s   {ms(pin)} {ms(whole)}")
    one, three = rows[0][3], rows[1][3]
    print(f"pin on 3 nodes / on 1 node: {statistics.median(three) / statistics.median(one):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="actorsys-bench-multinode-") as root:
        make_model(f"{root}/base", seed=0)
        snapshots = [f"{root}/s1", f"{root}/s2"]
        for seed, snapshot in enumerate(snapshots, start=1):
            make_snapshot(f"{root}/base", snapshot, seed=seed)
        started = time.monotonic()
        nodes = [{"num_cpus": 1, "resources": {f"node_{i}": 3, "slot": 1}} for i in range(NODES)]
        with local_cluster(*nodes):
            print(f"{NODES}-node local cluster up    {time.monotonic() - started:6.2f} s")
            trio.run(measure, f"{root}/base", snapshots, args.points)


if __name__ == "__main__":
    main()

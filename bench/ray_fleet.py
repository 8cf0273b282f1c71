"""What running the engines on Ray costs: the cluster's start, and per point, RayFleet against
LocalFleet on the same engine (the embedded CPU engine on the same tiny model).

Run: ``.venv/bin/python bench/ray_fleet.py [--points 8]``

1. ``ray.init(num_cpus=2)`` on this machine, and the time until one engine actor is serving.
2. The same points through EvalSupervisor on each fleet (alternating between two snapshots
   given as ``checkpoint_dir``, so every pin loads new weights and no export is involved):
   the pin (``eval/pin_time_seconds``) and the whole point (submit until it settled, an eval
   of 4 greedy completions of 8 tokens included). Prints medians and the Ray/local ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ray
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actorsys import (  # noqa: E402
    CheckpointEvalFn,
    EvalConfig,
    EvalSupervisor,
    Fleet,
    MemorySink,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from actorsys.fleet.local import LocalFleet, embedded  # noqa: E402
from actorsys.fleet.ray import RayFleet  # noqa: E402
from tests.models import PROMPTS, make_model, make_snapshot  # noqa: E402


class Complete(CheckpointEvalFn):
    async def evaluate_checkpoint(
        self, checkpoint_dir: str, input: RolloutFnEvalInput
    ) -> RolloutFnEvalOutput:
        answers = await input.fleet.complete(PROMPTS, max_tokens=8)
        return RolloutFnEvalOutput(data={"answers": [a.text for a in answers]})


async def point_times(fleet: Fleet, snapshots: list[str], points: int) -> tuple[list[float], list[float]]:
    sink = MemorySink()
    whole = []
    async with EvalSupervisor.open(EvalConfig(), eval_fn=Complete(), fleet=fleet, sink=sink) as sup:
        for step in range(1, points + 1):
            started = trio.current_time()
            await sup.submit(step, checkpoint_dir=snapshots[step % 2])
            await sup.drain(timeout=120)
            whole.append(trio.current_time() - started)
    assert all(o.ok for o in sink.outcomes), [o.reason for o in sink.outcomes]
    return [o.metrics["eval/pin_time_seconds"] for o in sink.outcomes], whole


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:7.1f} ms"


async def compare(base: str, snapshots: list[str], points: int) -> None:
    started = time.monotonic()
    async with RayFleet.open(base, num_engines=1, resources={"num_cpus": 0.5}) as ray_fleet:
        print(f"engine actor serving after  {time.monotonic() - started:6.2f} s")
        ray_pin, ray_whole = await point_times(ray_fleet.fleet, snapshots, points)
    async with LocalFleet.open([embedded(base)]) as local:
        local_pin, local_whole = await point_times(local.fleet, snapshots, points)
    print(f"median over {points} points    LocalFleet    RayFleet   ratio")
    for label, local_times, ray_times in (("pin", local_pin, ray_pin),
                                          ("whole point", local_whole, ray_whole)):
        ratio = statistics.median(ray_times) / statistics.median(local_times)
        print(f"  {label:<22} {ms(local_times)} {ms(ray_times)}   {ratio:4.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        make_model(f"{root}/base", seed=0)
        snapshots = [f"{root}/s1", f"{root}/s2"]
        for seed, snapshot in enumerate(snapshots, start=1):
            make_snapshot(f"{root}/base", snapshot, seed=seed)
        started = time.monotonic()
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, object_store_memory=80 * 1024 * 1024)
        print(f"ray.init(num_cpus=2)        {time.monotonic() - started:6.2f} s")
        try:
            trio.run(compare, f"{root}/base", snapshots, args.points)
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main()

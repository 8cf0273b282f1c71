"""A scoring worker's start: wall time and memory of a cold worker, as it is against as it was.

Run: ``.venv/bin/python bench/scoring_workers.py [--repeats 3]``

Each case spawns a fresh worker process (a trio-parallel context of its own, as the pool's
first job meets one), runs one job in it and reports the time from the call to the answer and
the worker's resident memory (``VmRSS``) afterwards, with which heavy modules it imported:

- ``now``: the pool's warm-up job, a plain function of ``actorsys.evals.scoring.jobs`` (the
  packages around the scorers import their names on first use);
- ``boot``: what the worker imported before the package inits were lazy: the pool module
  itself (trio, trio-parallel, the runtime) beside the scorers, which bare stand-in packages
  let it import without torch;
- ``eager``: what a worker would import with eager package inits and no stand-ins (every
  public name of ``actorsys``: torch, transformers, the pipeline).

Each job also scores a math-verify sample (the pool's warm-up). The cases alternate
``--repeats`` times; medians, and each case against ``now``. This module imports nothing at
its top but the standard library: a spawned worker imports the main module first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "trio", "trio_parallel")


def _report() -> dict[str, Any]:
    with open("/proc/self/status", encoding="utf-8") as status:
        rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return {"rss_mb": rss / 1024, "heavy": [m for m in HEAVY if m in sys.modules]}


def now() -> dict[str, Any]:
    from actorsys.evals.scoring.jobs import warm_up

    warm_up(["math"])
    return _report()


def boot() -> dict[str, Any]:
    import importlib

    importlib.import_module("actorsys.evals.scoring.pool")
    return now()


def eager() -> dict[str, Any]:
    import actorsys

    for name in actorsys.__all__:
        getattr(actorsys, name)
    return now()


CASES = {"now": now, "boot": boot, "eager": eager}


async def cold(job: Any) -> tuple[float, dict[str, Any]]:
    import trio_parallel

    async with trio_parallel.open_worker_context(grace_period=30) as context:
        started = time.perf_counter()
        found = await context.run_sync(job)
        return time.perf_counter() - started, found


async def main(repeats: int) -> None:
    seconds: dict[str, list[float]] = {name: [] for name in CASES}
    memory: dict[str, list[float]] = {name: [] for name in CASES}
    heavy: dict[str, list[str]] = {}
    for _ in range(repeats):
        for name, job in CASES.items():
            took, found = await cold(job)
            seconds[name].append(took)
            memory[name].append(found["rss_mb"])
            heavy[name] = found["heavy"]
    base_s, base_mb = statistics.median(seconds["now"]), statistics.median(memory["now"])
    print(f"cold worker start + warm-up, medians of {repeats} (cpu count {os.cpu_count()})")
    print(f"{'case':6} {'start s':>8} {'/ now':>6} {'RSS MB':>8} {'/ now':>6}  imported")
    for name in CASES:
        s, mb = statistics.median(seconds[name]), statistics.median(memory[name])
        print(f"{name:6} {s:8.2f} {s / base_s:6.2f} {mb:8.1f} {mb / base_mb:6.2f}  "
              f"{', '.join(heavy[name]) or '-'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    import trio

    trio.run(main, args.repeats)

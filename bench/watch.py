"""The watch service: time from a checkpoint's ``.complete`` marker to the start of its
evaluation, and ``--once`` throughput over a backlog with one fleet and with two.

Run: ``.venv/bin/python bench/watch.py [--checkpoints 20 --poll-interval 1.0 --latency-points 5]``

Drives the same :class:`~actorsys.watch.service.Watcher` and fleet launcher as
``actorsys watch``, with embedded CPU engines and a real :class:`~actorsys.evals.DatasetEval`
(a small JSONL dataset, greedy).

1. Latency: one engine, polling every ``--poll-interval`` s; checkpoints are published one at
   a time (weights first, the marker last) and each waits until the previous was evaluated.
   Expected: about half the poll interval on average, plus the scan.
2. Throughput: ``--checkpoints`` complete checkpoints, ``--once``, on 1 fleet of 1 engine and
   on 2 fleets of 1 engine each; wall time of the run (engine start-up excluded).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import trio
from transformers.utils import logging as transformers_logging

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actorsys.evals import DatasetEval, EvalDataset  # noqa: E402
from actorsys.watch import fleets  # noqa: E402
from actorsys.watch.service import Watcher, WatchSettings, eval_key  # noqa: E402
from tests.models import PROMPTS, make_model, make_snapshot  # noqa: E402


class StampedEval(DatasetEval):
    """DatasetEval that notes the wall-clock time each evaluation starts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started: dict[int, float] = {}

    async def evaluate_checkpoint(self, checkpoint_dir: str, input: Any) -> Any:
        self.started[input.rollout_id] = time.time()
        return await super().evaluate_checkpoint(checkpoint_dir, input)


class Landed:
    """A sink that lets the benchmark wait for a step's outcome."""

    def __init__(self) -> None:
        self.events: dict[int, trio.Event] = {}

    def record(self, outcome: Any) -> None:
        self.events.setdefault(outcome.step, trio.Event()).set()

    async def wait(self, step: int) -> None:
        await self.events.setdefault(step, trio.Event()).wait()


def dataset(directory: Path) -> EvalDataset:
    path = directory / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "label": "x"}) + "\n" for p in PROMPTS * 4))
    return EvalDataset.from_jsonl(path, name="tiny", max_tokens=8)


def publish(base: Path, target: Path, seed: int) -> float:
    """Write a complete checkpoint under a name that is no checkpoint's, then rename it to
    ``target``; return when it appeared."""
    staged = target.with_name(f"{target.name}-staged")
    make_snapshot(base, staged, seed=seed)
    staged.rename(target)
    return time.time()


async def latency(work: Path, data: EvalDataset, points: int, poll: float) -> list[float]:
    root = work / "latency"
    make_model(root / "step_0", seed=0)
    evals = StampedEval([data])
    settings = WatchSettings(root=str(root), out=str(work / "latency-out"), poll_interval=poll)
    landed = Landed()
    watcher = Watcher(settings, eval_fn=evals, eval_key=eval_key([data]), sink=landed,
                      fleets_for=partial(fleets.started_fleets, engines=1, fleets=1,
                                         flavor="sglang", log_dir=None))
    marked: dict[int, float] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watcher.run)
        await landed.wait(0)
        for step in range(1, points + 1):
            await trio.sleep(poll * step / (points + 1))  # spread the markers over the poll phase
            marked[step] = await trio.to_thread.run_sync(
                publish, root / "step_0", root / f"step_{step}", step
            )
            await landed.wait(step)
        await watcher.interrupt()
    return [evals.started[step] - marked[step] for step in range(1, points + 1)]


async def throughput(work: Path, data: EvalDataset, checkpoints: int, fleet_count: int) -> float:
    root = work / f"backlog-{fleet_count}"
    make_model(root / "step_1", seed=1)
    for step in range(2, checkpoints + 1):
        make_snapshot(root / "step_1", root / f"step_{step}", seed=step)
    evals = StampedEval([data])
    settings = WatchSettings(root=str(root), out=str(work / f"out-{fleet_count}"), once=True,
                             poll_interval=1.0)
    started_at: list[float] = []

    def timed(first: Any) -> Any:
        launcher = fleets.started_fleets(first, engines=fleet_count, fleets=fleet_count,
                                         flavor="sglang", log_dir=None)

        class Timed:
            async def __aenter__(self) -> Any:
                value = await launcher.__aenter__()
                started_at.append(time.monotonic())
                return value

            async def __aexit__(self, *exc: Any) -> Any:
                started_at.append(time.monotonic())
                return await launcher.__aexit__(*exc)

        return Timed()

    watcher = Watcher(settings, eval_fn=evals, eval_key=eval_key([data]), fleets_for=timed)
    report = await watcher.run()
    assert len(report.ok) == checkpoints, report
    return started_at[1] - started_at[0]


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="actorsys-bench-watch-"))
    try:
        data = dataset(work)
        delays = await latency(work, data, args.latency_points, args.poll_interval)
        print(f"marker -> eval start, poll interval {args.poll_interval:.1f} s, "
              f"{len(delays)} checkpoints: median {statistics.median(delays):.3f} s, "
              f"min {min(delays):.3f} s, max {max(delays):.3f} s")
        one = await throughput(work, data, args.checkpoints, 1)
        two = await throughput(work, data, args.checkpoints, 2)
        print(f"watch --once over {args.checkpoints} checkpoints: 1 fleet {one:.2f} s "
              f"({args.checkpoints / one:.2f} ckpt/s), 2 fleets {two:.2f} s "
              f"({args.checkpoints / two:.2f} ckpt/s); 2 fleets / 1 fleet speed-up {one / two:.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=20)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--latency-points", type=int, default=5)
    arguments = parser.parse_args()
    transformers_logging.disable_progress_bar()
    trio.run(main, arguments)

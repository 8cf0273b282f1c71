"""What keeping the best snapshots costs a point, as a ratio to the point's duration.

    .venv/bin/python bench/best_cost.py [--points 12] [--hidden 256] [--layers 4]

A real supervisor exports a tiny Llama (``submit(model=...)``) at every point, and a real eval
fn reads the snapshot's tensors back (safetensors) and scores them, one point at a time. Two
runs side by side in this process, the same points in the same order:

- ``off``: ``keep_snapshots=1`` and nothing more;
- ``best``: the same with ``best_metric``, ``keep_best=2``, ``patience`` and ``stop_when``
  (scores go up and down, so the best change, and displaced snapshots are retired).

For ``best``, the work best-keeping adds is timed where it runs: ``BestKeeper.offer`` (in the
trio thread, at each settle) and the atomic write of ``best.json`` (tmp + fsync + rename +
fsync of the dir, in the Retirer's delete thread). Each point's duration is its wall time from
``submit`` to settled. Printed: per point medians, the ratio added work / point duration
(goal <= 0.01), and the end-to-end median point time of ``best`` over ``off`` (noisy on a
busy machine; the direct timing is the number to read).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from safetensors.torch import load_file  # noqa: E402

from actorsys import (  # noqa: E402
    CheckpointEvalFn,
    EvalConfig,
    EvalSupervisor,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from actorsys.actors import best as best_module  # noqa: E402
from actorsys.actors import retirer as retirer_module  # noqa: E402
from tests.models import make_model  # noqa: E402

SCORES = [0.30, 0.50, 0.45, 0.60, 0.55, 0.58, 0.70, 0.65, 0.40, 0.72, 0.71, 0.69]


class ReadsSnapshot(CheckpointEvalFn):
    """Loads every tensor of the snapshot (in a thread) and scores the point from a script."""

    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        def read() -> float:
            total = 0.0
            for name in sorted(os.listdir(checkpoint_dir)):
                if name.endswith(".safetensors"):
                    total += sum(float(t.float().abs().mean()) for t in load_file(
                        os.path.join(checkpoint_dir, name)).values())
            return total

        await trio.to_thread.run_sync(read)
        score = SCORES[int(input.rollout_id) % len(SCORES)]
        return RolloutFnEvalOutput(data={}, metrics={"eval/acc": score})


class Timed:
    """Wall time spent in a wrapped function, per call."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def wrap(self, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.calls.append(time.perf_counter() - start)

        return timed


async def run(config: EvalConfig, model: torch.nn.Module, points: int) -> list[float]:
    durations = []
    async with EvalSupervisor.open(config, eval_fn=ReadsSnapshot()) as sup:
        await sup.prepare(model=model)
        for step in range(1, points + 1):
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(1e-3)
            start = time.perf_counter()
            assert await sup.submit(step, model=model)
            await sup.drain()
            durations.append(time.perf_counter() - start)
    return durations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                        help="where hf_dir goes (default /dev/shm, tmpfs, as recommended)")
    args = parser.parse_args()
    logging.getLogger("actorsys").setLevel(logging.WARNING)

    offers, writes = Timed(), Timed()
    best_module.BestKeeper.offer = offers.wrap(best_module.BestKeeper.offer)  # type: ignore[method-assign]
    retirer_module.write_record = writes.wrap(retirer_module.write_record)  # type: ignore[assignment]

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        base = Path(tmp, "base")
        model = make_model(base, hidden=args.hidden, layers=args.layers).train()
        nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        plain = EvalConfig(hf_dir=Path(tmp, "off"), base_checkpoint=base, keep_snapshots=1)
        keeping = EvalConfig(hf_dir=Path(tmp, "best"), base_checkpoint=base, keep_snapshots=1,
                             best_metric="eval/acc", keep_best=2, patience=100,
                             stop_when={"eval/acc": 0.99})
        off: list[float] = []
        best: list[float] = []
        offer_calls: list[float] = []
        for _ in range(2):  # interleaved, so both see the machine's same moods
            off += trio.run(run, plain, model, args.points // 2)
            offers.calls.clear()  # the off run's offers return at once; count the best run's
            best += trio.run(run, keeping, model, args.points // 2)
            offer_calls += offers.calls
        best_json = Path(tmp, "best", "best.json").read_text()

    point = statistics.median(best)
    offer, write = statistics.median(offer_calls), statistics.median(writes.calls)
    added = offer + write * len(writes.calls) / len(best)
    print(f"model: {nbytes / 2**20:.1f} MiB fp32, {len(best)} points per run, hf_dir under {args.dir}")
    print(f"{'':28}{'median':>12}")
    print(f"{'point, best-keeping off':28}{statistics.median(off) * 1e3:>10.2f}ms")
    print(f"{'point, best-keeping on':28}{point * 1e3:>10.2f}ms")
    print(f"{'BestKeeper.offer':28}{offer * 1e6:>10.1f}us  ({len(offer_calls)} calls)")
    print(f"{'best.json write (fsync)':28}{write * 1e6:>10.1f}us  ({len(writes.calls)} writes)")
    print(f"added work / point duration: {added / point:.5f}  (goal <= 0.01; met by points of "
          f">= {added / 0.01:.2f} s)")
    print(f"end-to-end median, on / off: {point / statistics.median(off):.3f}  (noisy)")
    print(f"best.json at the end: {best_json.strip()}")


if __name__ == "__main__":
    main()

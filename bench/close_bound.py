"""How close the bridge's close keeps to its budget, and what a submit costs the host.

    .venv/bin/python bench/close_bound.py [--repeats 3] [--model-mb 64]

1. For each way an evaluation can hang (the scenarios the tests pin, in tests/bridge/hangs.py):
   ``close(timeout=T)`` wall time / T with T = 2 s (goal: <= 1.05), plus the same with
   ``drain=False`` (what leaving the block on Ctrl-C does).
2. The host's ``submit`` latency (p50 / p99): a bare weight copy (``capture``, into fresh
   memory and into a reused buffer set, the floor) next to a submit that is admitted (copy
   into the supervisor's pooled buffers + hand-over; interleaved with the bare copies, since
   copies vary with the memory's state), the hand-over alone (``checkpoint_dir=``, nothing to
   copy), and a submit while the pipeline is saturated under ``overflow="skip"`` (evaluations
   hang; nothing is copied).

Everything runs in this one process, side by side, and prints one table per part.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "bridge"))

from hangs import SCENARIOS, Hang  # noqa: E402

from actorsys import CheckpointEvalFn, EvalConfig, RolloutFnEvalInput  # noqa: E402
from actorsys.snapshot import BufferPool, capture, plan_state  # noqa: E402
from bridge import AsyncEvalBridge, EvalBridge  # noqa: E402

T = 2.0


class Instant(CheckpointEvalFn):
    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:  # noqa: A002
        return {}


def close_once(scenario: str, checkpoint_dir: str, *, drain: bool) -> float:
    with SCENARIOS[scenario]() as eval_fn, EvalBridge(EvalConfig(), eval_fn=eval_fn) as bridge:
        bridge.submit(1, checkpoint_dir=checkpoint_dir)
        if not eval_fn.entered.wait(30):
            raise RuntimeError(f"{scenario}: the evaluation never started")
        started = time.monotonic()
        report = bridge.close(timeout=T, drain=drain)
        elapsed = time.monotonic() - started
    if report.abandoned != [1]:
        raise RuntimeError(f"{scenario}: abandoned {report.abandoned}, expected [1]")
    return elapsed


def async_close_once(checkpoint_dir: str, *, drain: bool) -> float:
    async def host(eval_fn: Hang) -> float:
        async with AsyncEvalBridge(EvalConfig(), eval_fn=eval_fn) as bridge:
            await bridge.submit(1, checkpoint_dir=checkpoint_dir)
            await asyncio.to_thread(eval_fn.entered.wait, 30)
            started = time.monotonic()
            await bridge.close(timeout=T, drain=drain)
            return time.monotonic() - started

    with SCENARIOS["asyncio_eval_awaits_forever"]() as eval_fn:
        return asyncio.run(host(eval_fn))


def close_table(repeats: int) -> None:
    checkpoint_dir = tempfile.mkdtemp(prefix="close-bound-")
    cases: list[tuple[str, Callable[[bool], float]]] = [
        (name, lambda drain, name=name: close_once(name, checkpoint_dir, drain=drain))
        for name in SCENARIOS
    ]
    cases.append(("asyncio host: asyncio eval awaits forever",
                  lambda drain: async_close_once(checkpoint_dir, drain=drain)))
    print(f"\nclose(timeout=T), T = {T:.0f} s, {repeats} runs each: wall time / T "
          "(min / median / max)")
    print(f"| {'hang':<42} | {'drain=True':^20} | {'drain=False':^20} |")
    print(f"|{'-' * 44}|{'-' * 22}|{'-' * 22}|")
    for name, run in cases:
        cells = []
        for drain in (True, False):
            ratios = sorted(run(drain) / T for _ in range(repeats))
            cells.append(f"{ratios[0]:.3f} / {statistics.median(ratios):.3f} / {ratios[-1]:.3f}")
        print(f"| {name:<42} | {cells[0]:^20} | {cells[1]:^20} |", flush=True)


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered), p99


def submit_table(model_mb: int, copies: int, saturated: int) -> None:
    width = 1024
    layers = max(1, round(model_mb * 1024 * 1024 / (4 * width * width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    nbytes = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    staging = tempfile.mkdtemp(prefix="submit-latency-")

    fresh, reused, admitted, handover = [], [], [], []
    pool = BufferPool(max_sets=1)
    plan = plan_state(model)
    config = EvalConfig(hf_dir=os.path.join(staging, "a"), max_in_flight=2, keep_snapshots=0)
    with EvalBridge(config, eval_fn=Instant()) as bridge:
        for step in range(copies):
            started = time.perf_counter()
            capture(model).release()
            fresh.append(time.perf_counter() - started)
            lease = pool.try_lease(plan.buffer_nbytes, pinned=False)
            started = time.perf_counter()
            weights = capture(model, buffers=lease)
            reused.append(time.perf_counter() - started)
            weights.release()
            started = time.perf_counter()
            if not bridge.submit(step, model=model):
                raise RuntimeError("an admitted submit was expected")
            admitted.append(time.perf_counter() - started)
            bridge.drain(timeout=60)
        for step in range(copies, copies + saturated):
            started = time.perf_counter()
            bridge.submit(step, checkpoint_dir=staging)
            handover.append(time.perf_counter() - started)
            bridge.drain(timeout=60)

    busy = []
    config = EvalConfig(hf_dir=os.path.join(staging, "b"), overflow="skip", max_in_flight=2)
    with SCENARIOS["trio_eval_never_returns"]() as eval_fn, EvalBridge(
        config, eval_fn=eval_fn
    ) as bridge:
        bridge.submit(0, model=model)
        bridge.submit(1, model=model)
        eval_fn.entered.wait(30)
        for step in range(2, saturated + 2):
            started = time.perf_counter()
            if bridge.submit(step, model=model):
                raise RuntimeError("a saturated skip submit was admitted")
            busy.append(time.perf_counter() - started)
        bridge.close(timeout=T, drain=False)

    copy_p50, _ = percentiles(reused)
    print(f"\nhost-side submit latency, model {nbytes / 2**20:.0f} MiB fp32 ({layers} x "
          f"Linear({width}, {width})), CPU")
    print(f"| {'call':<52} | {'n':>4} | {'p50 ms':>8} | {'p99 ms':>8} | {'p50 / reused':>12} |")
    print(f"|{'-' * 54}|{'-' * 6}|{'-' * 10}|{'-' * 10}|{'-' * 14}|")
    for label, samples in (
        ("bare weight copy into fresh memory", fresh),
        ("bare weight copy into a reused buffer set", reused),
        ("submit, admitted (copy + hand-over)", admitted),
        ("submit, admitted, nothing to copy (hand-over only)", handover),
        ("submit, pipeline saturated, skip (evals hang)", busy),
    ):
        p50, p99 = percentiles(samples)
        print(f"| {label:<52} | {len(samples):>4} | {p50 * 1e3:>8.2f} | {p99 * 1e3:>8.2f} | "
              f"{p50 / copy_p50:>12.3f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model-mb", type=int, default=64)
    parser.add_argument("--copies", type=int, default=15)
    parser.add_argument("--saturated", type=int, default=300)
    args = parser.parse_args()
    logging.getLogger("actorsys").setLevel(logging.ERROR)
    close_table(args.repeats)
    submit_table(args.model_mb, args.copies, args.saturated)


if __name__ == "__main__":
    main()

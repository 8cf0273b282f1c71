"""A warm ``submit(model=...)``'s stall against a bare copy, in a fresh process and after
another supervisor of the same process submitted first (a trainer with two supervisors, a
notebook, a test process).

Run: ``.venv/bin/python bench/second_supervisor.py [--rounds 2] [--quick]`` (about three
minutes on 2 cores). Each case runs in a process of its own, the cases alternating, ``--rounds``
times each:

- ``fresh``: one supervisor, the only one the process opened;
- ``after state_dict``: another supervisor first ran ``submit(0, state_dict=...)`` and closed;
- ``after model``: the same with ``submit(0, model=...)``.

In each process the measured supervisor submits 8 points of the same model (the first warms
up) and the bare copy of its state dict into reused buffers is timed beside each; the row
gives the medians, and their ratio. Also printed: the same bare copy on one torch thread, the
speed a copy would fall to if a previous submit had left the process copying on one thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from submit_stall import Nothing, model_of  # noqa: E402

from actorsys import EvalConfig, EvalSupervisor, MemorySink  # noqa: E402

CASES = ("fresh", "after state_dict", "after model")
POINTS = 8


def bare_copy(state: dict[str, torch.Tensor], into: dict[str, torch.Tensor]) -> float:
    started = time.perf_counter()
    for name, tensor in state.items():
        into[name].copy_(tensor)
    return time.perf_counter() - started


async def one_case(case: str, quick: bool) -> None:
    """Measure ``case`` in this process; print ``stall bare one_thread`` in seconds."""
    model = model_of(quick)
    state = model.state_dict()
    floor = {name: torch.empty_like(t) for name, t in state.items()}
    with tempfile.TemporaryDirectory() as staging:
        if case != "fresh":
            config = EvalConfig(hf_dir=Path(staging) / "first", max_in_flight=2, keep_snapshots=0)
            async with EvalSupervisor.open(config, eval_fn=Nothing(), sink=MemorySink()) as first:
                if case == "after state_dict":
                    await first.submit(0, state_dict=state)
                else:
                    await first.submit(0, model=model)
                await first.drain()
        config = EvalConfig(hf_dir=Path(staging) / "measured", max_in_flight=2, keep_snapshots=0)
        stalls, bares = [], []
        async with EvalSupervisor.open(config, eval_fn=Nothing(), sink=MemorySink()) as sup:
            await sup.prepare(model=model)
            for step in range(POINTS):
                bares.append(bare_copy(state, floor))
                started = time.perf_counter()
                await sup.submit(step, model=model)
                stalls.append(time.perf_counter() - started)
                await sup.drain()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    one_thread = statistics.median(bare_copy(state, floor) for _ in range(3))
    torch.set_num_threads(threads)
    print(statistics.median(stalls[1:]), statistics.median(bares[1:]), one_thread)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # a child's
    args = parser.parse_args()
    if args.case is not None:
        trio.run(one_case, args.case, args.quick)
        return
    rows: dict[str, list[tuple[float, float, float]]] = {case: [] for case in CASES}
    for _ in range(args.rounds):
        for case in CASES:
            command = [sys.executable, __file__, "--case", case, *(["--quick"] if args.quick else [])]
            done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
            stall, bare, one = map(float, done.stdout.split()[-3:])
            rows[case].append((stall, bare, one))
    state = model_of(args.quick).state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    print(f"model {nbytes / 1e6:.0f} MB, {os.cpu_count()} cores, torch threads "
          f"{torch.get_num_threads()}, {args.rounds} processes a case, {POINTS - 1} warm points each")
    print("| case | warm submit stall, ms | bare copy, ms | stall / bare copy | bare copy on 1 thread, ms |")
    print("|---|---|---|---|---|")
    for case, values in rows.items():
        stall, bare, one = (statistics.median(column) for column in zip(*values, strict=True))
        ratios = ", ".join(f"{s / b:.2f}" for s, b, _ in values)
        print(f"| {case} | {stall * 1000:.1f} | {bare * 1000:.1f} | {stall / bare:.2f} ({ratios}) "
              f"| {one * 1000:.1f} |")


if __name__ == "__main__":
    main()

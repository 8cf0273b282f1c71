"""Where the weight probe's time goes on the pin's critical path, on one real CPU engine.

Run: ``.venv/bin/python bench/probe_parts.py [--hidden 512 --layers 8 --repeats 8]``

Times, against one engine serving a model of the given size (alternating between two
snapshots so that every load is new): the load, the version read-back, the prefill probe as
the fleet asks it (``PREFILL_SEQUENCES`` sequences in one request) and with one sequence, and
a two-token prefill (the engine's fixed cost of a request and a forward pass). Each part is
timed by the clock and by the engine process's CPU time (all its threads), which a busy
machine inflates far less than the clock: the CPU time of a probe against that of a
two-token prefill tells the forward pass's share apart from the request's. Then the
reference worker: from its start (:meth:`ReferenceWorker.warm`) until its first reference is
back, and a reference alone once it is warm. The probe adds its prefill to a pin (the
read-back and the probe are asked together); the reference is off the pin's critical path.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actorsys.fleet.local import LocalFleet, embedded  # noqa: E402
from actorsys.fleet.pin.probe import PrefillEngine, prefill_sequences, read_probe_prompts
from actorsys.fleet.pin.reference import ReferenceWorker  # noqa: E402
from tests.models import make_model, make_snapshot  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """The CPU time process ``pid`` and its descendants (the engine runs under a reaper) have
    used so far, summed over their threads (the scheduler's count, in nanoseconds:
    ``/proc/PID/stat`` counts in ticks of 10 ms)."""
    total = 0
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        for task in os.listdir(f"/proc/{process.pid}/task"):
            try:
                with open(f"/proc/{process.pid}/task/{task}/schedstat", encoding="ascii") as f:
                    total += int(f.read().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue
    return total / 1e9


async def timed(call: Callable[[], Awaitable[object]]) -> float:
    started = trio.current_time()
    await call()
    return trio.current_time() - started


async def timed_both(
    call: Callable[[], Awaitable[object]], pid: int, cpu: list[float]
) -> float:
    """The clock time of ``call``; appends the engine process's CPU time to ``cpu``."""
    before = cpu_seconds(pid)
    elapsed = await timed(call)
    cpu.append(cpu_seconds(pid) - before)
    return elapsed


async def reference_times(
    snapshots: list[str], args: argparse.Namespace, times: dict[str, list[float]]
) -> float:
    """Times references of ``snapshots`` into ``times``; returns the time from the worker's
    start until its first reference."""
    worker = ReferenceWorker()
    try:
        prompts = read_probe_prompts(snapshots[0])
        started = trio.current_time()
        await worker.warm()
        await worker.compute(snapshots[0], prompts)
        first = trio.current_time() - started
        for index in range(args.repeats):
            path = snapshots[index % 2]
            times.setdefault("reference, warm worker", []).append(
                await timed(lambda: worker.compute(path, prompts)))  # noqa: B023
    finally:
        await worker.aclose()
    return first


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="actorsys-bench-") as tmp:
        root = Path(tmp)
        make_model(root / "base", seed=0, hidden=args.hidden, layers=args.layers)
        snapshots = [str(root / "a"), str(root / "b")]
        for seed, path in enumerate(snapshots, start=1):
            make_snapshot(root / "base", path, seed=seed)
        sequences = prefill_sequences(read_probe_prompts(snapshots[0]))
        times: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        async with LocalFleet.open([embedded(str(root / "base"), threads=1)],
                                   startup_timeout=300) as local:
            engine = local.engines[0].client
            pid = local.engines[0].process.pid
            assert isinstance(engine, PrefillEngine)
            parts: dict[str, Callable[[], Awaitable[object]]] = {
                "version read-back": engine.weight_version,
                f"prefill probe, {len(sequences)} sequences": (
                    lambda: engine.prompt_logprobs(sequences)),
                "prefill probe, 1 sequence": lambda: engine.prompt_logprobs(sequences[:1]),
                "prefill of 2 tokens": lambda: engine.prompt_logprobs([sequences[0][:2]]),
            }
            for index in range(args.repeats):
                path = snapshots[index % 2]
                times.setdefault("load", []).append(await timed_both(
                    lambda: engine.load_weights(path, f"v{index}"),  # noqa: B023
                    pid, cpu.setdefault("load", [])))
                for label, call in parts.items():
                    times.setdefault(label, []).append(
                        await timed_both(call, pid, cpu.setdefault(label, [])))
        first = None if args.no_reference else await reference_times(snapshots, args, times)
        print(f"model: hidden {args.hidden}, {args.layers} layers; {args.repeats} repeats\n")
        print("| part | median ms | min ms | engine CPU, median ms |")
        print("|---|---|---|---|")
        for label, values in times.items():
            used = f"{1000 * statistics.median(cpu[label]):.0f}" if label in cpu else ""
            print(f"| {label} | {1000 * statistics.median(values):.1f} "
                  f"| {1000 * min(values):.1f} | {used} |")
        if first is not None:
            print(f"| reference worker started until its first reference | {1000 * first:.0f} "
                  "| | |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--no-reference", action="store_true",
                        help="time the engine's parts only (a reference at the worker's lower "
                             "priority takes long on a busy machine)")
    trio.run(main, parser.parse_args())

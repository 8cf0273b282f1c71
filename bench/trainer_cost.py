"""What the trainer pays for evaluation, in one run: memory, stall, and time to eval start.

Run: ``.venv/bin/python bench/trainer_cost.py [--hidden 1024 --layers 10 --steps 24 --every 4]``
(a ~400 MB fp32 Llama; about 10 minutes on 2 busy cores).

A real CPU engine (``python -m actorsys engine``, one, in its own process) serves the model.
Three trainers run, each in a fresh process so that each peak RSS is its own: training alone
(``bare``), and training with an ``EvalSupervisor`` submitting every ``--every`` steps to the
engine with the weight probe on (``probe``) and off (``noprobe``). Each reports:

- its peak RSS (``ru_maxrss``), so the eval trainers' can be set against the bare one plus
  the weight buffers (``max_in_flight`` copies of the weights, by design);
- each point's stall (how long ``submit`` blocks; ``overflow="skip"``, so never a wait for
  an earlier point) against a bare copy of the same weights into reused buffers, timed in
  the same process after training;
- (``probe``) the reference worker's memory, sampled every 10 ms while it runs: anonymous
  (a copy) and file-backed (the mapped snapshot), against the model's bytes;
- each point's pin until eval start (``eval/pin_time_seconds``), probe on against off.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss_of(pid: int) -> dict[str, float]:
    values: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                key, _, rest = line.partition(":")
                if key in ("RssAnon", "RssFile"):
                    values[key] = int(rest.split()[0]) / 2**10
    except OSError:
        pass
    return values


class WorkerSampler:
    """The peak anonymous and file-backed memory of this process's reference workers."""

    def __init__(self) -> None:
        self.peak = {"RssAnon": 0.0, "RssFile": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> WorkerSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.wait(0.01):
            for child in me.children(recursive=True):
                try:
                    if "actorsys.fleet.pin.reference" not in " ".join(child.cmdline()):
                        continue
                except psutil.Error:
                    continue
                for key, value in rss_of(child.pid).items():
                    self.peak[key] = max(self.peak[key], value)


def train_step(model: Any, optimizer: Any, batch: Any) -> None:
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def bare_copies(model: Any, repeats: int) -> list[float]:
    import torch

    params = [p.detach() for p in model.state_dict().values()]
    buffers = [torch.empty_like(p) for p in params]
    for b, p in zip(buffers, params, strict=True):
        b.copy_(p)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for b, p in zip(buffers, params, strict=True):
            b.copy_(p)
        times.append(time.perf_counter() - started)
    return times


def trainer(args: argparse.Namespace) -> dict[str, Any]:
    """One trainer process: ``args.mode`` is ``bare``, ``probe`` or ``noprobe``."""
    import torch
    import trio

    from actorsys import (
        CheckpointEvalFn,
        EvalConfig,
        EvalSupervisor,
        Fleet,
        MemorySink,
        RolloutFnEvalOutput,
        SGLangEngine,
    )
    from actorsys.fleet.model_load import load_causal_lm

    class Nothing(CheckpointEvalFn):
        async def evaluate_checkpoint(self, checkpoint_dir: str, input: Any) -> RolloutFnEvalOutput:
            await trio.lowlevel.checkpoint()
            return RolloutFnEvalOutput(data={})

    torch.manual_seed(0)
    model = load_causal_lm(args.base, dtype=torch.float32).train()
    nbytes = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    batch = torch.randint(0, model.config.vocab_size, (2, 16))
    stalls: list[float] = []
    sink = MemorySink()

    async def run() -> None:
        if args.mode == "bare":
            for _ in range(args.steps):
                train_step(model, optimizer, batch)
            return
        fleet = Fleet([SGLangEngine(args.url, api_key=args.key)])
        # overflow="skip": a submit never waits for an earlier point (the stall is the
        # submit's own cost); a point that finds max_in_flight points ahead settles `busy`.
        config = EvalConfig(hf_dir=args.staging, probe=args.mode == "probe", overflow="skip",
                            base_checkpoint=args.base, pin_timeout=600.0, close_timeout=60.0)
        async with EvalSupervisor.open(config, eval_fn=Nothing(), fleet=fleet, sink=sink) as sup:
            await sup.prepare(model=model)
            for step in range(1, args.steps + 1):
                train_step(model, optimizer, batch)
                if step % args.every == 0:
                    started = time.perf_counter()
                    admitted = await sup.submit(step, model=model)
                    if admitted:
                        stalls.append(time.perf_counter() - started)
            await sup.drain(timeout=600)

    sampler = WorkerSampler()
    with sampler:
        trio.run(run)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    copies = bare_copies(model, 9)
    outcomes = sorted(sink.outcomes, key=lambda o: o.step)
    return {
        "mode": args.mode,
        "model_mb": nbytes / 2**20,
        "peak_rss_mb": peak,
        "stalls": stalls,
        "copies": copies,
        "pin_times": [o.metrics.get("eval/pin_time_seconds") for o in outcomes if o.ok],
        "statuses": [(o.step, o.status, o.reason) for o in outcomes],
        "worker_peak_mb": sampler.peak,
    }


def run_trainer(mode: str, args: argparse.Namespace, url: str, key: str, root: Path) -> dict[str, Any]:
    staging = root / f"staging-{mode}"
    argv = [sys.executable, __file__, "--trainer", mode, "--base", str(root / "base"),
            "--url", url, "--key", key, "--staging", str(staging),
            "--steps", str(args.steps), "--every", str(args.every)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the {mode} trainer failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def worker_memory(root: Path) -> dict[str, dict[str, float]]:
    """The reference worker's peak memory computing a tiny model's reference (what the
    interpreter, torch and transformers cost) and then the bench model's."""
    from actorsys.fleet.pin.probe import read_probe_prompts
    from actorsys.fleet.pin.reference import ReferenceWorker
    from tests.models import make_model

    make_model(root / "tiny", seed=1)
    worker = ReferenceWorker()
    peaks = {}
    try:
        for name in ("tiny", "base"):
            path = str(root / name)
            with WorkerSampler() as sampler:
                await worker.compute(path, read_probe_prompts(path))
            peaks[name] = sampler.peak
    finally:
        await worker.aclose()
    return peaks


async def orchestrate(args: argparse.Namespace, root: Path) -> None:
    from actorsys.fleet.local import LocalFleet, embedded
    from tests.models import make_model

    make_model(root / "base", seed=0, hidden=args.hidden, layers=args.layers)
    peaks = await worker_memory(root)
    async with LocalFleet.open([embedded(str(root / "base"), threads=1)], startup_timeout=300) as local:
        url = local.engines[0].client.url  # type: ignore[attr-defined]
        key = local.api_key or ""
        results = {mode: run_trainer(mode, args, url, key, root) for mode in ("bare", "probe", "noprobe")}
    bare, probe, noprobe = results["bare"], results["probe"], results["noprobe"]
    model_mb = bare["model_mb"]
    buffers_mb = 2 * model_mb
    print(f"model: {model_mb:.0f} MB fp32; {args.steps} steps, a point every {args.every}; "
          f"one CPU engine; statuses probe {probe['statuses']}, no probe {noprobe['statuses']}\n")
    print("| trainer | peak RSS MB | peak - bare MB | (peak - buffers) / bare |")
    print("|---|---|---|---|")
    for result in (bare, probe, noprobe):
        peak = result["peak_rss_mb"]
        extra = buffers_mb if result is not bare else 0.0
        print(f"| {result['mode']} | {peak:.0f} | {peak - bare['peak_rss_mb']:.0f} "
              f"| {(peak - extra) / bare['peak_rss_mb']:.3f} |")
    print(f"\n(weight buffers: max_in_flight=2 sets of {model_mb:.0f} MB = {buffers_mb:.0f} MB)\n")
    print("| trainer | stall per admitted point, ms (each) | bare copy ms, median (min) "
          "| median stall / median copy |")
    print("|---|---|---|---|")
    for result in (probe, noprobe):
        copy = median(result["copies"])
        each = ", ".join(f"{1000 * s:.0f}" for s in result["stalls"])
        print(f"| {result['mode']} | {each} | {1000 * copy:.0f} ({1000 * min(result['copies']):.0f}) "
              f"| {median(result['stalls']) / copy:.2f} |")
    worker = probe["worker_peak_mb"]
    print(f"\nreference worker peak during the probe trainer's run: anonymous "
          f"{worker['RssAnon']:.0f} MB, file-backed (mapped) {worker['RssFile']:.0f} MB; no "
          f"worker without the probe: {noprobe['worker_peak_mb']}")
    tiny, big = peaks["tiny"], peaks["base"]
    added = big["RssAnon"] - tiny["RssAnon"]
    print("\n| reference worker, peak MB | anonymous | file-backed (mapped) |")
    print("|---|---|---|")
    print(f"| a tiny model (interpreter, torch, transformers) | {tiny['RssAnon']:.0f} "
          f"| {tiny['RssFile']:.0f} |")
    print(f"| the {model_mb:.0f} MB model | {big['RssAnon']:.0f} | {big['RssFile']:.0f} |")
    print(f"\nanonymous memory the model adds to the worker / model bytes: {added / model_mb:.3f}"
          f"; whole worker anonymous / model bytes: {big['RssAnon'] / model_mb:.3f}")
    on, off = median(probe["pin_times"]), median(noprobe["pin_times"])
    print(f"\npin until eval start, median s: probe {on:.3f}, no probe {off:.3f}, "
          f"ratio {on / off:.2f}  (each: {probe['pin_times']} / {noprobe['pin_times']})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--trainer", choices=("bare", "probe", "noprobe"))
    parser.add_argument("--base")
    parser.add_argument("--url")
    parser.add_argument("--key")
    parser.add_argument("--staging")
    args = parser.parse_args()
    if args.trainer:
        args.mode = args.trainer
        print(json.dumps(trainer(args)))
        return
    import trio

    with tempfile.TemporaryDirectory(prefix="actorsys-trainer-cost-") as tmp:
        trio.run(orchestrate, args, Path(tmp))


if __name__ == "__main__":
    main()

"""What the trainer pays for an evaluation point: non-blocking export vs. the blocking save.

Run: ``.venv/bin/python bench/export.py`` (about 2 minutes on 2 cores; ``--quick`` for a
smoke run; ``--threads 1`` on a machine whose cores other processes share, where torch's
parallel copies and steps stall on descheduled threads). Side by side in one process, on one
disk, with medians over repetitions:

1. the trainer's stall per eval point with ``EvalSupervisor.submit(step, model=...)``;
2. the blocking pattern: ``save_pretrained`` inside the training loop, fsync'd (durable);
3. the floor: a bare ``state_dict`` copy into reused CPU buffers;
4. the *first* point of a job, in fresh processes (as after a restart), with and without
   ``EvalSupervisor.prepare(model=...)`` at start, against a warm point and the blocking
   save measured in the same process;

plus the Exporter's write throughput against a raw sequential write + fsync of the same bytes
in the same directory, the peak RSS while exports run, and a small training loop's steps/s
with an eval every 10 steps against none (and against a blocking save every 10 steps). Prints
a table and the ratios against their targets.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import psutil
import torch
import trio
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel

from actorsys import CheckpointEvalFn, EvalConfig, EvalSupervisor, MemorySink
from actorsys.contracts import RolloutFnEvalInput, RolloutFnEvalOutput
from actorsys.outcome import EXPORT_TIME_SECONDS
from actorsys.snapshot import fsync_tree

MB = 1000**2
MAX_IN_FLIGHT = 2


class CountFiles(CheckpointEvalFn):
    """An evaluation that costs nothing, so only the export is measured."""

    async def evaluate_checkpoint(
        self, checkpoint_dir: str, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        return RolloutFnEvalOutput(data={"files": len(os.listdir(checkpoint_dir))})


@dataclass
class Results:
    model_bytes: int = 0
    stall: float = 0.0
    first_stall: float = 0.0
    blocking: float = 0.0
    floor: float = 0.0
    export: float = 0.0
    raw_write: float = 0.0
    peak_rss: int = 0
    rss_runtime: int = 0
    rss_model: int = 0
    seconds: float = 0.0
    steps_plain: float = 0.0
    steps_eval: float = 0.0
    steps_blocking: float = 0.0
    loop_model_bytes: int = 0
    first_points: dict[str, list[dict[str, float]]] | None = None


def llama(hidden: int, layers: int, vocab: int, intermediate: int) -> PreTrainedModel:
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        tie_word_embeddings=False,
    )
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config)
    return model


def nbytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


@contextmanager
def peak_rss() -> Iterator[list[int]]:
    """Sample this process's RSS every 5 ms; the list holds the peak when the block ends."""
    process, peak, done = psutil.Process(), [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], process.memory_info().rss)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        done.set()
        thread.join()


async def measure_points(model: PreTrainedModel, workdir: str, reps: int, out: Results) -> None:
    """(1), (2) and (3) side by side, with the raw write: each repetition copies the state
    dict into reused buffers, submits a point and waits for its export, writes the same number
    of bytes raw, and saves the model the blocking way. Then, with the extra buffers freed, a
    burst of 3 submits fills ``max_in_flight`` while RSS is sampled."""
    sink = MemorySink()
    config = EvalConfig(hf_dir=os.path.join(workdir, "hf"), max_in_flight=MAX_IN_FLIGHT)
    floor_buffers = {name: torch.empty_like(t) for name, t in model.state_dict().items()}
    raw = torch.ones(out.model_bytes, dtype=torch.uint8).numpy()
    copy_floor(model, floor_buffers)
    floors, stalls, raws, blocking = [], [], [], []
    async with EvalSupervisor.open(config, eval_fn=CountFiles(), sink=sink) as sup:
        for step in range(reps + 1):
            floors.append(timed(lambda: copy_floor(model, floor_buffers)))
            started = time.perf_counter()
            await sup.submit(step, model=model)
            stalls.append(time.perf_counter() - started)
            await sup.drain()
            raws.append(timed(lambda: raw_write(raw, os.path.join(workdir, "raw.bin"))))
            blocking.append(timed(lambda: blocking_save(model, os.path.join(workdir, "saved"))))
            shutil.rmtree(os.path.join(workdir, "saved"))
        floor_buffers.clear()
        raw = np.empty(0, dtype=np.uint8)
        with peak_rss() as peak:
            for step in range(reps + 1, reps + 4):
                await sup.submit(step, model=model)
            await sup.drain()
    assert all(o.ok for o in sink.outcomes), sink.outcomes
    exports = [o.metrics[EXPORT_TIME_SECONDS] for o in sink.outcomes if o.step <= reps]
    out.peak_rss = peak[0]
    out.first_stall = stalls[0]
    out.stall, out.floor = statistics.median(stalls[1:]), statistics.median(floors[1:])
    out.export, out.raw_write = statistics.median(exports[1:]), statistics.median(raws[1:])
    out.blocking = statistics.median(blocking[1:])


async def first_point(variant: str, quick: bool, workdir: str) -> dict[str, float]:
    """(4), in this (fresh) process: the first submit, then warm submits and blocking saves of
    the same model, medians of 3. ``variant``: ``plain``; ``prepared`` (after ``prepare``);
    ``base`` (``base_checkpoint`` names the model the trainer starts from, and the first
    submit comes once the buffers it sized are faulted in, as it does after a trainer's first
    steps)."""
    torch.manual_seed(0)
    model = bench_model(quick)
    base = None
    if variant == "base":
        base = os.path.join(workdir, "base")
        model.save_pretrained(base)
    config = EvalConfig(
        hf_dir=os.path.join(workdir, "hf"), max_in_flight=MAX_IN_FLIGHT, base_checkpoint=base
    )
    result: dict[str, float] = {}
    async with EvalSupervisor.open(config, eval_fn=CountFiles()) as sup:
        if variant == "prepared":
            started = time.perf_counter()
            await sup.prepare(model=model)
            result["prepare"] = time.perf_counter() - started
        if variant == "base":
            started = time.perf_counter()
            with trio.fail_after(60):
                while True:
                    buffers = sup.statistics().buffers
                    if buffers is not None and buffers.prepared >= MAX_IN_FLIGHT:
                        break
                    await trio.sleep(0.01)
            result["prepare"] = time.perf_counter() - started
        started = time.perf_counter()
        await sup.submit(0, model=model)
        result["first"] = time.perf_counter() - started
        await sup.drain()
        warm = []
        for step in range(1, 4):
            started = time.perf_counter()
            await sup.submit(step, model=model)
            warm.append(time.perf_counter() - started)
            await sup.drain()
    result["warm"] = statistics.median(warm)
    saves = []
    for _ in range(3):
        saves.append(timed(lambda: blocking_save(model, os.path.join(workdir, "saved"))))
        shutil.rmtree(os.path.join(workdir, "saved"))
    result["blocking"] = statistics.median(saves)
    return result


def first_points(runs: int, quick: bool, workdir: str) -> dict[str, list[dict[str, float]]]:
    """(4) in fresh processes, alternating the variants (the load of a shared machine
    drifts)."""
    points: dict[str, list[dict[str, float]]] = {"plain": [], "prepared": [], "base": []}
    for _ in range(runs):
        for variant in points:
            command = [sys.executable, __file__, "--first-point", variant, "--dir", workdir]
            if quick:
                command.append("--quick")
            done = subprocess.run(command, check=True, capture_output=True, text=True)
            points[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return points


def bench_model(quick: bool) -> PreTrainedModel:
    model = llama(256, 2, 8000, 688) if quick else llama(768, 12, 32000, 2048)
    model.eval()
    return model


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def copy_floor(model: PreTrainedModel, buffers: dict[str, torch.Tensor]) -> None:
    """(3): copy the state dict into CPU buffers that earlier copies already faulted in."""
    for name, tensor in model.state_dict().items():
        buffers[name].copy_(tensor)


def raw_write(data: np.ndarray, path: str) -> None:
    """One sequential write of ``data`` from memory, then fsync."""
    with open(path, "wb") as f:
        f.write(data.data)
        f.flush()
        os.fsync(f.fileno())
    os.remove(path)


def blocking_save(model: PreTrainedModel, directory: str) -> None:
    """(2): what a trainer does without actorsys: save the HF checkpoint durably, and wait."""
    model.save_pretrained(directory)
    fsync_tree(directory)


class TrainingLoop:
    """A plain AdamW loop on a small model, run in blocks of 10 steps."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.ids = torch.randint(0, model.config.vocab_size, (1, 32))
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.step = 0

    async def block(self, on_eval: Callable[[int], Awaitable[object]] | None) -> float:
        """Seconds for 10 steps, awaiting ``on_eval(step)`` after the first (an eval every 10
        steps)."""
        started = time.perf_counter()
        for index in range(10):
            loss = self.model(self.ids, labels=self.ids).loss
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.step += 1
            if on_eval is not None and index == 0:
                await on_eval(self.step)
            await trio.lowlevel.checkpoint()
        return time.perf_counter() - started


async def measure_loops(workdir: str, blocks: int, out: Results, quick: bool) -> None:
    """Blocks of 10 steps with no eval, one ``submit`` and one blocking save, interleaved
    (the load of a shared machine drifts), compared by median block time."""
    model = llama(128, 2, 4000, 344) if quick else llama(512, 4, 16000, 1376)
    out.loop_model_bytes = nbytes(model)
    config = EvalConfig(hf_dir=os.path.join(workdir, "loop"), max_in_flight=MAX_IN_FLIGHT)
    loop = TrainingLoop(model)
    saved = os.path.join(workdir, "loop_saved")
    times: dict[str, list[float]] = {"plain": [], "eval": [], "blocking": []}
    async with EvalSupervisor.open(config, eval_fn=CountFiles()) as sup:

        async def submit(step: int) -> bool:
            return await sup.submit(step, model=model)

        async def save(step: int) -> None:
            blocking_save(model, saved)

        actions = {"plain": None, "eval": submit, "blocking": save}
        await loop.block(submit)
        for _ in range(blocks):
            for name, action in actions.items():
                times[name].append(await loop.block(action))
    out.steps_plain = 10 / statistics.median(times["plain"])
    out.steps_eval = 10 / statistics.median(times["eval"])
    out.steps_blocking = 10 / statistics.median(times["blocking"])


def report(out: Results) -> None:
    budget = out.model_bytes * (1 + MAX_IN_FLIGHT) + 300 * MB
    export_tput = out.model_bytes / out.export / MB
    raw_tput = out.model_bytes / out.raw_write / MB
    rows = [
        ("(3) state_dict copy into reused buffers", f"{out.floor * 1e3:8.1f} ms"),
        ("(1) trainer stall, submit(model=)", f"{out.stall * 1e3:8.1f} ms"),
        ("    first submit in this process", f"{out.first_stall * 1e3:8.1f} ms"),
        ("(2) blocking save_pretrained + fsync", f"{out.blocking * 1e3:8.1f} ms"),
        ("Exporter, export stage", f"{out.export * 1e3:8.1f} ms  {export_tput:6.0f} MB/s"),
        ("raw sequential write + fsync", f"{out.raw_write * 1e3:8.1f} ms  {raw_tput:6.0f} MB/s"),
        ("RSS: runtime (python, torch, transformers)", f"{out.rss_runtime / MB:8.0f} MB"),
        ("RSS: + the trainer's model", f"{out.rss_model / MB:8.0f} MB"),
        ("RSS: peak during a burst of 3 exports", f"{out.peak_rss / MB:8.0f} MB"),
        (f"loop, {out.loop_model_bytes / MB:.0f} MB model, no evals",
         f"{out.steps_plain:6.2f} it/s"),
        ("  eval every 10 steps, submit(model=)", f"{out.steps_eval:6.2f} it/s"),
        ("  save_pretrained every 10 steps", f"{out.steps_blocking:6.2f} it/s"),
    ]
    ratios = [
        ("stall(1) / copy(3)", out.stall / out.floor, "<= 1.15", out.stall / out.floor <= 1.15),
        ("stall(2) / stall(1)", out.blocking / out.stall, ">= 5", out.blocking / out.stall >= 5),
        ("Exporter / raw write throughput", out.raw_write / out.export, ">= 0.7",
         out.raw_write / out.export >= 0.7),
        (f"peak RSS / {budget / MB:.0f} MB budget", out.peak_rss / budget, "<= 1.0",
         out.peak_rss <= budget),
        ("RSS added by exports / model x max_in_flight",
         (out.peak_rss - out.rss_model) / (out.model_bytes * MAX_IN_FLIGHT), "report", None),
        ("steps/s, eval every 10 / none", out.steps_eval / out.steps_plain, "report", None),
        ("steps/s, save_pretrained every 10 / none", out.steps_blocking / out.steps_plain,
         "report", None),
    ]
    print(f"\nmodel: {out.model_bytes / MB:.0f} MB fp32, max_in_flight={MAX_IN_FLIGHT}, "
          f"{os.cpu_count()} cores, torch threads {torch.get_num_threads()}, "
          f"load average {os.getloadavg()[0]:.1f}, bench took {out.seconds:.0f} s")
    ratios.extend(first_point_ratios(out.first_points or {}))
    print(f"{'measure':44} {'median':>24}")
    for name, value in rows:
        print(f"{name:44} {value:>24}")
    for variant, runs in (out.first_points or {}).items():
        for run in runs:
            print(f"(4) first point, {variant:8} " + "  ".join(
                f"{key} {value * 1e3:6.1f} ms" for key, value in run.items()
            ))
    print(f"\n{'ratio':44} {'value':>8} {'target':>8} {'met':>5}")
    for name, value, target, met in ratios:
        verdict = "" if met is None else ("yes" if met else "NO")
        print(f"{name:44} {value:8.2f} {target:>8} {verdict:>5}")


def first_point_ratios(
    points: dict[str, list[dict[str, float]]],
) -> list[tuple[str, float, str, bool | None]]:
    """The first point against a warm one and the blocking save of its own process: the
    median over runs, and the worst run beside it."""
    limits = {"plain": 2.5, "prepared": 1.2, "base": 2.5}
    ratios: list[tuple[str, float, str, bool | None]] = []
    for variant, runs in points.items():
        if not runs:
            continue
        warm = [run["first"] / run["warm"] for run in runs]
        save = [run["first"] / run["blocking"] for run in runs]
        limit = limits[variant]
        ratios.append((f"first / warm submit, {variant}", statistics.median(warm),
                       f"<= {limit}", statistics.median(warm) <= limit))
        ratios.append((f"  worst of {len(runs)} runs", max(warm), "report", None))
        ratios.append((f"first submit / blocking save, {variant}", statistics.median(save),
                       "<= 1.0", statistics.median(save) <= 1.0))
    return ratios


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="where to write (default: a temporary dir)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--loop-blocks", type=int, default=5, help="10-step blocks per variant")
    parser.add_argument("--quick", action="store_true", help="small model, few reps")
    parser.add_argument("--first-runs", type=int, default=3, help="fresh processes per variant")
    parser.add_argument(
        "--points-only", action="store_true",
        help="only (1) against (3): the warm stall and the bare copy, side by side",
    )
    parser.add_argument("--first-point", choices=["plain", "prepared", "base"], help=argparse.SUPPRESS)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's)"
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    workdir = tempfile.mkdtemp(prefix="actorsys-bench-", dir=args.dir)
    if args.first_point is not None:
        try:
            result = await first_point(args.first_point, args.quick, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        print(json.dumps(result))
        return
    reps = 2 if args.quick else args.reps
    out = Results(rss_runtime=psutil.Process().memory_info().rss)
    if args.points_only:
        try:
            torch.manual_seed(0)
            model = bench_model(args.quick)
            out.model_bytes = nbytes(model)
            await measure_points(model, workdir, reps, out)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        ratio = out.stall / out.floor
        print(f"model {out.model_bytes / MB:.0f} MB: warm stall {out.stall * 1e3:.1f} ms, bare copy "
              f"{out.floor * 1e3:.1f} ms, stall(1) / copy(3) {ratio:.2f} (goal <= 1.15)")
        return
    started = time.perf_counter()
    try:
        out.first_points = first_points(1 if args.quick else args.first_runs, args.quick, workdir)
        torch.manual_seed(0)
        model = bench_model(args.quick)
        out.model_bytes = nbytes(model)
        out.rss_model = psutil.Process().memory_info().rss
        await measure_points(model, workdir, reps, out)
        del model
        await measure_loops(workdir, 2 if args.quick else args.loop_blocks, out, args.quick)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out.seconds = time.perf_counter() - started
    report(out)


if __name__ == "__main__":
    trio.run(main)

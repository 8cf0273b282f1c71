"""The demo's training run: a tiny model learns addition in this thread while the bridge
evaluates a snapshot every K steps on a local fleet, and the trainer never waits for a score.

What it leaves in ``out``: ``metrics.jsonl`` (one outcome a line), ``eval.png`` (eval accuracy
by step beside the training loss), ``held_out.jsonl`` (the problems scored), ``base/`` (the
untrained checkpoint the engines start from), ``staging/`` (the snapshots) and ``logs/`` (the
engines' logs); a later run deletes or overwrites only these (see :mod:`actorsys.demo.out_dir`).
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

import torch
from rich.console import Console

from actorsys.config import EvalConfig
from actorsys.demo.addition import ANSWER_TOKENS, write_base_checkpoint
from actorsys.demo.fleet_thread import FleetThread
from actorsys.demo.out_dir import prepare_out
from actorsys.demo.progress import DemoProgress
from actorsys.fleet.local import VLLM_PYTHON
from actorsys.metrics_file import Point
from actorsys.outcome import Outcome
from actorsys.sinks import JsonlSink
from actorsys.sinks.fanout import FanoutSink
from actorsys.watch.fleets import engine_specs

log = logging.getLogger("actorsys.demo")

DATASET = "addition"
SCORE = f"eval/{DATASET}"
BATCH = 64
LEARNING_RATE = 1e-3
WARMUP_STEPS = 200


@dataclass(frozen=True)
class DemoSettings:
    steps: int = 1200
    every: int = 100
    engines: int = 2
    engine: str = "embedded"
    out: str = "demo-out"
    fleets: int = 2


@dataclass
class DemoResult:
    outcomes: list[Outcome]
    losses: list[tuple[int, float]]
    stalls: dict[int, float] = field(default_factory=dict)
    blocking_save_seconds: float = 0.0
    wall_seconds: float = 0.0


def measure_blocking_save(model: torch.nn.Module) -> float:
    """Seconds one blocking ``save_pretrained`` plus fsync of every file takes (what a trainer
    that saves in its own thread would stall per eval point)."""
    with tempfile.TemporaryDirectory(prefix="actorsys-demo-save-") as directory:
        started = time.perf_counter()
        model.save_pretrained(directory)  # type: ignore[operator]
        for name in os.listdir(directory):
            with open(os.path.join(directory, name), "rb") as f:
                os.fsync(f.fileno())
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return time.perf_counter() - started


def run_demo(settings: DemoSettings, console: Console) -> DemoResult:
    """Train, evaluate live, write the metrics; blocks until the last point settled (or
    ``close_timeout`` ran out). Raises :class:`ConfigError` before anything else when ``out``
    holds files an earlier demo did not make. Ctrl-C stops the training, cuts off the evaluations and stops
    the engines, then raises KeyboardInterrupt."""
    from actorsys.evals import DatasetEval, EvalDataset
    from bridge import EvalBridge

    started = time.monotonic()
    out = os.path.abspath(settings.out)
    prepare_out(out)
    base = os.path.join(out, "base")
    staging = os.path.join(out, "staging")
    metrics_path = os.path.join(out, "metrics.jsonl")
    held_out = os.path.join(out, "held_out.jsonl")

    torch.set_num_threads(1)
    task, model = write_base_checkpoint(base)
    task.write_held_out(held_out)
    dataset = EvalDataset.from_jsonl(
        held_out, name=DATASET, scorer="numeric", max_tokens=ANSWER_TOKENS, temperature=0.0
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda index: min(1.0, (index + 1) / WARMUP_STEPS)
    )
    result = DemoResult(outcomes=[], losses=[], blocking_save_seconds=measure_blocking_save(model))
    config = EvalConfig(
        hf_dir=staging,
        base_checkpoint=base,
        max_in_flight=2,
        overflow="skip",
        keep_snapshots=1,
        eval_timeout=120.0,
        close_timeout=30.0,
    )
    console.print(
        f"[bold]actorsys demo[/]: {settings.steps} training steps of 2-digit addition, an eval "
        f"point every {settings.every} steps on {settings.engines} {settings.engine} engine(s)"
    )
    console.print(f"starting {settings.engines} engine(s) (logs in {out}/logs)...")
    fleet_count = min(settings.fleets, settings.engines)
    jsonl = JsonlSink(metrics_path)
    try:
        specs = engine_specs(base, engines=settings.engines, flavor=settings.engine)
        with FleetThread(specs, fleets=fleet_count, log_dir=os.path.join(out, "logs")) as held:
            progress = DemoProgress(steps=settings.steps, score=SCORE, console=console)
            with progress, EvalBridge(
                config, eval_fn=DatasetEval([dataset]), fleet=held.fleets, sink=FanoutSink([jsonl, progress])
            ) as bridge:
                model.train()
                for step in range(1, settings.steps + 1):
                    loss = model(**task.batch(BATCH)).loss
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    schedule.step()
                    value = float(loss.detach())
                    result.losses.append((step, value))
                    progress.train_step(step, value)
                    bridge.note_step(step)
                    if step % settings.every == 0 or step == settings.steps:
                        final = step == settings.steps
                        submitted = time.perf_counter()
                        bridge.submit(step, model=model, force=final)
                        stall = time.perf_counter() - submitted
                        progress.submitted(step, stall)
                        if not final:
                            result.stalls[step] = stall
                bridge.drain(timeout=config.close_timeout)
            result.outcomes = list(progress.outcomes)
    finally:
        jsonl.close()
    result.wall_seconds = time.monotonic() - started
    return result


def points_of(outcomes: list[Outcome]) -> list[Point]:
    return [Point(o.step, o.status, o.reason, dict(o.metrics), o.snapshot) for o in outcomes]


def print_summary(result: DemoResult, settings: DemoSettings, console: Console) -> None:
    """The results, on ``console`` (stdout)."""
    ok = sorted((o for o in result.outcomes if o.ok), key=lambda o: o.step)
    skipped = [o for o in result.outcomes if not o.ok]
    console.print(f"[bold]done in {result.wall_seconds:.0f} s[/]: {len(ok)} eval points ok, "
                  f"{len(skipped)} skipped"
                  + (f" ({', '.join(f'{o.step}: {o.reason}' for o in skipped)})" if skipped else ""))
    if ok:
        scores = ", ".join(f"{o.step}: {o.metrics.get(SCORE, float('nan')):.2f}" for o in ok)
        console.print(f"held-out accuracy by step: {scores}")
        lags = [o.metrics.get("eval/lag_steps", 0.0) for o in ok]
        console.print(f"lag of a score behind training: median {statistics.median(lags):.0f} steps")
    if result.stalls:
        stalls_ms = [s * 1000 for s in result.stalls.values()]
        console.print(
            f"trainer stall per eval point: median {statistics.median(stalls_ms):.1f} ms, "
            f"max {max(stalls_ms):.1f} ms (the weight copy; the last point, which may wait "
            "for a slot, left out); "
            f"a blocking save_pretrained + fsync of this model: "
            f"{result.blocking_save_seconds * 1000:.1f} ms"
        )
    out = os.path.abspath(settings.out)
    console.print(f"wrote {out}/metrics.jsonl and {out}/eval.png")


def check_engine(settings: DemoSettings) -> str | None:
    """Why ``settings.engine`` cannot run here, or None."""
    if settings.engine == "vllm" and not os.path.exists(VLLM_PYTHON):
        return (
            f"argument --engine: {VLLM_PYTHON} not found; run scripts/setup_vllm.sh or pass "
            "--engine embedded"
        )
    return None


def stderr_console() -> Console:
    return Console(file=sys.stderr)

"""Time per point of LmEvalTasks on a 100-sample task, on a fleet of one and of two engines.

Run: ``.venv/bin/python bench/lm_eval_tasks.py [--samples 100 --points 2 --hidden 256 --layers 4]``

Two local lm-eval tasks over generated JSONL, each ``--samples`` documents: ``bench_mc``
(multiple choice, 4 choices: 4 log-likelihood requests a document) and ``bench_gen``
(greedy generation, up to 16 tokens). Points go through EvalSupervisor to embedded CPU
engines (no router: the eval fn's gate spreads requests over the engines); the time per point
is the eval's ``eval/duration_seconds`` (lm-eval's set-up included, its task index excluded:
it is built once, before the first point). Prints the median per task and fleet size and the
ratio one engine / two engines.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from actorsys import EvalConfig, EvalSupervisor, LmEvalTasks, MemorySink  # noqa: E402
from actorsys.fleet.local import LocalFleet, embedded  # noqa: E402
from actorsys.outcome import DURATION_SECONDS  # noqa: E402
from tests.models import CORPUS, make_model, make_snapshot  # noqa: E402

TASK_YAML = """
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
{body}
metadata:
  version: 1.0
"""
MC_BODY = """output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{label}}"
metric_list:
  - metric: acc
"""
GEN_BODY = """output_type: generate_until
doc_to_text: "{{prompt}}"
doc_to_target: "{{answer}}"
generation_kwargs:
  until: ["never seen"]
  max_gen_toks: 16
  do_sample: false
metric_list:
  - metric: exact_match
"""


def write_tasks(directory: Path, samples: int) -> None:
    words = sorted({word for line in CORPUS for word in line.split()})
    rng = random.Random(0)
    mc, gen = directory / "bench_mc.jsonl", directory / "bench_gen.jsonl"
    with open(mc, "w", encoding="utf-8") as file:
        for _ in range(samples):
            question = " ".join(rng.choices(words, k=6))
            file.write(json.dumps({"question": question, "choices": rng.sample(words, 4), "label": 0}) + "\n")
    with open(gen, "w", encoding="utf-8") as file:
        for _ in range(samples):
            file.write(json.dumps({"prompt": " ".join(rng.choices(words, k=6)), "answer": "x"}) + "\n")
    for name, data, body in (("bench_mc", mc, MC_BODY), ("bench_gen", gen, GEN_BODY)):
        (directory / f"{name}.yaml").write_text(TASK_YAML.format(name=name, data=data, body=body))


async def seconds_per_point(
    root: Path, task: str, engines: int, points: int, fn: LmEvalTasks
) -> list[float]:
    sink = MemorySink()
    config = EvalConfig(
        hf_dir=root / f"staging-{task}-{engines}", eval_timeout=1800.0, pin_timeout=300.0
    )
    async with (
        LocalFleet.open([embedded(str(root / "base"))] * engines) as local,
        EvalSupervisor.open(config, eval_fn=fn, fleet=local.fleet, sink=sink) as sup,
    ):
        for step in range(1, points + 1):
            await sup.submit(step, checkpoint_dir=str(root / f"step{1 + step % 2}"))
            await sup.drain(timeout=1800.0)
    outcomes = sink.by_step()
    for outcome in outcomes.values():
        assert outcome.ok, (outcome.reason, outcome.data)
    return [outcomes[step].metrics[DURATION_SECONDS] for step in range(1, points + 1)]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--points", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-lm-eval-") as tmp:
        root = Path(tmp)
        make_model(root / "base", seed=0, hidden=args.hidden, layers=args.layers)
        for step in (1, 2):
            make_snapshot(root / "base", root / f"step{step}", seed=step)
        tasks = root / "tasks"
        tasks.mkdir()
        write_tasks(tasks, args.samples)
        print(f"model hidden={args.hidden} layers={args.layers}; {args.samples} samples a task; "
              f"{args.points} points per row; engines use 1 torch thread each; {os.cpu_count()} CPUs")
        print(f"{'task':<10} {'engines':>7} {'s/point (median)':>17} {'all points (s)':>24}")
        for task in ("bench_mc", "bench_gen"):
            fn = LmEvalTasks(task, include_path=tasks, num_concurrent=8)
            await trio.to_thread.run_sync(fn.load_tasks)
            medians = {}
            for engines in (1, 2):
                times = await seconds_per_point(root, task, engines, args.points, fn)
                medians[engines] = statistics.median(times)
                shown = ", ".join(f"{t:.2f}" for t in times)
                print(f"{task:<10} {engines:>7} {medians[engines]:>17.2f} {shown:>24}")
            print(f"{task:<10} ratio 1 engine / 2 engines: {medians[1] / medians[2]:.2f}x")


if __name__ == "__main__":
    trio.run(main)

"""What the standard errors cost a point: a dataset's metrics computed with and without them,
side by side in one run, against a point's measured duration.

Run: ``.venv/bin/python bench/stderr_cost.py --metrics OUT/metrics.jsonl [--rounds 7]``

For each sample set (``--shapes``, prompts x samples a prompt; the default spans a small set
answered once, MATH-500 with 4 samples, AIME with 16 and a large set with 16), scores drawn at
random (a prompt's chance of being right drawn per prompt, so pass@k varies), it times
:func:`~actorsys.evals.scoring.metrics.dataset_metrics` as it is and with its
``prompt_stderr`` replaced by one that returns 0 (the metrics without the errors), alternating
the two in each round (the machine's load drifts), and prints the medians and their difference:
what the errors cost. The point's duration is the median ``eval/duration_seconds`` of the ok
points of ``--metrics`` (a file ``demo`` or ``watch`` wrote), or ``--point-seconds``; the ratio
printed is the errors' cost over it (the goal: at most 0.01). The demo's point is far smaller
than the larger sets, so for them the ratio overstates the cost: a point that samples 16,000
answers takes minutes, not the demo's seconds.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actorsys.evals.scoring import metrics as metrics_module  # noqa: E402
from actorsys.evals.scoring.metrics import Sample, dataset_metrics  # noqa: E402
from actorsys.metrics_file import read_points  # noqa: E402
from actorsys.outcome import DURATION_SECONDS  # noqa: E402


def sample_set(prompts: int, n: int, rng: random.Random) -> list[Sample]:
    samples = []
    for p in range(prompts):
        chance = rng.random()
        samples.extend(Sample(f"prompt {p}", "answer", "label", float(rng.random() < chance),
                              "stop", 64) for _ in range(n))
    return samples


def timed(samples: list[Sample], n: int, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        dataset_metrics("bench", samples, n)
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", type=Path, help="a metrics file whose points' durations "
                                                     "are the point's duration")
    parser.add_argument("--point-seconds", type=float, help="a point's duration instead")
    parser.add_argument("--shapes", default="64x1,500x4,30x16,1000x16",
                        help="sample sets: PROMPTSxSAMPLES, comma-separated")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=5, help="calls timed in each round")
    args = parser.parse_args()
    if args.metrics is not None:
        durations = [p.metrics[DURATION_SECONDS] for p in read_points(args.metrics)
                     if p.ok and DURATION_SECONDS in p.metrics]
        if not durations:
            parser.error(f"{args.metrics} has no ok point with {DURATION_SECONDS}")
        point = statistics.median(durations)
        where = f"median {DURATION_SECONDS} of {len(durations)} ok points of {args.metrics}"
    elif args.point_seconds is not None:
        point, where = args.point_seconds, "--point-seconds"
    else:
        parser.error("pass --metrics FILE or --point-seconds S")
    print(f"point duration: {point:.3f} s ({where})")
    print("busy shared machine: medians over alternating rounds; read the ratios, not the ms")
    rng = random.Random(0)
    real = metrics_module.prompt_stderr
    for shape in args.shapes.split(","):
        prompts, n = (int(part) for part in shape.split("x"))
        samples = sample_set(prompts, n, rng)
        with_errors, without = [], []
        for _ in range(args.rounds):
            metrics_module.prompt_stderr = real
            with_errors.append(timed(samples, n, args.repeat))
            metrics_module.prompt_stderr = lambda values: 0.0
            without.append(timed(samples, n, args.repeat))
        metrics_module.prompt_stderr = real
        on, off = statistics.median(with_errors), statistics.median(without)
        cost = max(on - off, 0.0)
        print(f"{prompts:>5} prompts x {n:>2} samples: metrics {off * 1e3:8.3f} ms without the "
              f"errors, {on * 1e3:8.3f} ms with; the errors cost {cost * 1e3:7.3f} ms = "
              f"{cost / point:.2e} of the point")


if __name__ == "__main__":
    main()

"""Scoring throughput: the worker-process pool against scoring in a thread, as it was.

Run: ``.venv/bin/python bench/scorers.py [--answers 2000 --repeats 3]``

For each built-in scorer (``exact``, ``numeric``, ``choice``, ``math``) scores the same
answers, alternating ``--repeats`` times,

- in one worker thread (``trio.to_thread.run_sync`` over ``score``: the old way, which an
  answer that hangs sympy freezes together with the whole process);
- in the pool (``score_in_workers``: chunks in worker processes, a ``score_timeout`` each),
  already warm (the first call's worker start is printed on its own).

Prints answers per second (medians) and ``pool / thread``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actorsys.evals import score  # noqa: E402
from actorsys.evals.scoring.pool import SCORING_WORKERS, Item, score_in_workers  # noqa: E402

SAMPLES: dict[str, list[tuple[str, str]]] = {
    "exact": [("Paris", "Paris"), ("Lyon ", "Paris")],
    "numeric": [("so the total is 1,234.0", "1234"), ("about 12 apples", "13")],
    "choice": [("The answer is (C).", "C"), ("\\boxed{B}", "D")],
    "math": [("so \\boxed{\\frac{1}{2}}", "0.5"), ("$x = 2\\sqrt{2}$", "\\sqrt{8}"),
             ("\\boxed{3}", "4")],
}


def answers(scorer: str, count: int) -> list[Item]:
    pairs = SAMPLES[scorer]
    return [(pairs[i % len(pairs)][0], pairs[i % len(pairs)][1], None) for i in range(count)]


async def in_thread(scorer: str, items: list[Item]) -> list[float]:
    return await trio.to_thread.run_sync(
        lambda: [score(scorer, answer, label) for answer, label, _ in items]
    )


async def in_pool(scorer: str, items: list[Item]) -> list[float]:
    return [s.value for s in await score_in_workers(scorer, items, score_timeout=10.0)]


async def timed(run: Callable[[str, list[Item]], Awaitable[list[float]]], scorer: str,
                items: list[Item]) -> tuple[float, list[float]]:
    started = time.perf_counter()
    values = await run(scorer, items)
    return time.perf_counter() - started, values


async def main(count: int, repeats: int) -> None:
    started = time.perf_counter()
    await score_in_workers("math", answers("math", 1), score_timeout=60.0)
    print(f"pool of {SCORING_WORKERS} workers: first call (start, import math-verify) "
          f"{time.perf_counter() - started:.2f} s")
    print(f"{'scorer':8} {'thread /s':>11} {'pool /s':>11} {'pool / thread':>14}")
    for scorer in SAMPLES:
        items = answers(scorer, count)
        thread_times, pool_times = [], []
        for _ in range(repeats):
            seconds, expected = await timed(in_thread, scorer, items)
            thread_times.append(seconds)
            seconds, got = await timed(in_pool, scorer, items)
            pool_times.append(seconds)
            assert got == expected, f"{scorer}: the pool scored differently"
        thread_rate = count / statistics.median(thread_times)
        pool_rate = count / statistics.median(pool_times)
        print(f"{scorer:8} {thread_rate:11.0f} {pool_rate:11.0f} {pool_rate / thread_rate:14.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    trio.run(main, args.answers, args.repeats)

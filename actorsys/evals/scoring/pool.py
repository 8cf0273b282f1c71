"""Scoring in worker processes: a scorer may hang, the process that asked never does.

One model answer can send a scorer into work that never ends and never lets go of the GIL:
math-verify on ``\\boxed{9^{9^{9^{9}}}}`` asks sympy for a power of billions of digits, one C
call. In a thread that stops the trio loop and every other thread of the process (the
trainer's, the pipeline's, close's), and no timeout, cancel scope or Ctrl-C can fire. So every
answer is scored in a worker process, within its dataset's ``score_timeout`` seconds; an
answer past it scores 0 and its worker is killed (SIGKILL: the only thing that stops such a
call). Cancelling a scoring call (``eval_timeout``, close) kills the workers it holds too.

The pool is trio-parallel's process-wide worker context: spawned processes, kept warm for ten
idle minutes and shared by every evaluation of the process, of which at most
:data:`SCORING_WORKERS` score for us at once. Being spawned, a worker imports the main module
first: a training script that evaluates in its own process needs the usual
``if __name__ == "__main__":`` guard, as for torch's DataLoader workers.

A worker is light: every job is a plain function of :mod:`actorsys.evals.scoring.jobs`, sent
by reference, so a worker imports the scorers and what they need, not torch (the packages
``actorsys`` and ``actorsys.evals`` import their names on first use).

Answers travel in chunks of :data:`CHUNK` (a round trip costs about as much as scoring a few
hundred exact-match answers). A chunk must finish within one answer's ``score_timeout``; one
that does not is scored again answer by answer, so an answer scores 0 for time only when it
alone overran. A worker's first job imports the scorer's modules and scores a sample (sympy
and math-verify's parsers load at their first use), so each call first warms its workers,
bounded by :data:`WARM_TIMEOUT` instead of ``score_timeout``: that budget counts only the
scoring of the answers. A worker that died is replaced by a fresh one, warmed the same way
before it scores again. :func:`warm_workers` does the same ahead of time: when a supervisor
opens, an evaluation that scores in workers (``DatasetEval``, ``ServerEvalFn``) warms them in
the background (:func:`actorsys.evals.harnesses.sampling.warm_scorers`), so the first point finds them
ready and its own warming is a round trip per worker.

Under trio's MockClock with autojump (deterministic tests), the clock is held while a scoring
call runs (:func:`~actorsys.runtime.holding_clock`): its waits on the workers'
pipes look idle to trio, and a jump would expire ``score_timeout`` (and every other deadline)
at once.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import cloudpickle
import trio
import trio_parallel

from actorsys.evals.scoring.jobs import Item, score_batch, warm_up
from actorsys.evals.scoring.scorers import Grading, Scorer, scorer_name
from actorsys.runtime import holding_clock

log = logging.getLogger("actorsys.evals")

SCORING_WORKERS = max(1, min(4, os.cpu_count() or 1))
"""At most this many of our answers are scored at once, each in its own worker process."""
CHUNK = 32
WARM_TIMEOUT = 120.0

_LIMITERS: trio.lowlevel.RunVar[tuple[trio.CapacityLimiter, trio.CapacityLimiter]] = (
    trio.lowlevel.RunVar("actorsys_scoring_limiters")
)
T = TypeVar("T")


@dataclass(frozen=True)
class Scored:
    """The score of one answer; ``error`` says why a failed one scored 0."""

    value: float
    error: str | None = None


def pickling_problem(scorer: Scorer) -> str | None:
    """Why ``scorer`` cannot travel to a worker process, or None. It travels with cloudpickle,
    as trio-parallel sends every job, so lambdas and local functions are fine."""
    if not callable(scorer):
        return None
    try:
        cloudpickle.dumps(scorer, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        return (
            f"the scorer {scorer_name(scorer)} cannot be pickled ({exc}); scorers run in a "
            "worker process, so pass a module-level function, or a callable object whose state "
            "pickles (no open files, locks, sockets or clients)"
        )
    return None


async def score_in_workers(
    scorer: Scorer, items: Sequence[Item], *, score_timeout: float
) -> list[Scored]:
    """Score ``items`` with ``scorer`` in worker processes, each within ``score_timeout`` seconds;
    the scores in item order. Never raises for a scorer: one that raises, overruns or kills
    its worker scores that answer 0 with an ``error``.

    Blocks on the workers (the trio loop keeps running meanwhile); a chunk's ``score_timeout`` runs
    from the moment a worker is free for it. Cancelling it kills the workers it holds; the
    caller's cancel scope (``eval_timeout``, close) bounds it.
    """
    if not items:
        return []
    results: list[Scored] = [Scored(0.0, "not scored")] * len(items)
    async with holding_clock():
        failure = await _warm([scorer], SCORING_WORKERS)
        if failure is not None:
            log.warning("scoring workers could not start: %s (every answer scored 0)", failure)
            return [Scored(0.0, f"scoring workers could not start: {failure}") for _ in items]

        async def chunk(start: int) -> None:
            part = items[start : start + CHUNK]
            for offset, result in enumerate(await _score_chunk(scorer, part, score_timeout)):
                results[start + offset] = result

        async with trio.open_nursery() as nursery:
            for start in range(0, len(items), CHUNK):
                nursery.start_soon(chunk, start)
    return results


async def _score_chunk(
    scorer: Scorer, items: Sequence[Item], score_timeout: float
) -> list[Scored]:
    try:
        raw = await _in_worker(score_timeout, score_batch, scorer, list(items))
        return [Scored(value, message) for value, message in raw]
    except trio.TooSlowError:
        error = (f"scorer {scorer_name(scorer)} took longer than score_timeout={score_timeout} s "
                 "(its worker was killed)")
    except trio_parallel.BrokenWorkerError as exc:
        error = f"its scoring worker died ({exc.args[0] if exc.args else exc!r})"
    if len(items) == 1:
        return [Scored(0.0, error)]
    await _warm([scorer], 1)
    return [scored for item in items for scored in await _score_chunk(scorer, [item], score_timeout)]


async def warm_workers(scorers: Sequence[Scorer | Grading]) -> None:
    """Start (or find warm) the workers a scoring call uses, with every one of ``scorers``'
    modules imported, each within :data:`WARM_TIMEOUT`; logs why they could not (the scoring
    call tries again and says so in its answers' errors). Cancelling it kills the workers it
    is starting."""
    if not scorers:
        return
    async with holding_clock():
        failure = await _warm(scorers, SCORING_WORKERS)
    if failure is not None:
        log.warning("scoring workers could not warm up: %s", failure)


async def _warm(scorers: Sequence[Scorer | Grading], workers: int) -> str | None:
    """Start (or find warm) ``workers`` workers with ``scorers``' modules imported; why they
    could not, or None."""
    failures: list[str] = []

    async def one() -> None:
        try:
            await _in_worker(WARM_TIMEOUT, warm_up, list(scorers))
        except trio.TooSlowError:
            failures.append(f"no worker ready within {WARM_TIMEOUT} s")
        except Exception as exc:
            failures.append(repr(exc))

    async with trio.open_nursery() as nursery:
        for _ in range(workers):
            nursery.start_soon(one)
    return failures[0] if failures else None


async def _in_worker(seconds: float, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` (a function of :mod:`~actorsys.evals.scoring.jobs`) in a worker once one
    of ours is free, killed after ``seconds`` (:class:`trio.TooSlowError`)."""
    limiter, unlimited = _limiters()
    async with limiter:
        with trio.fail_after(seconds):
            return await trio_parallel.run_sync(fn, *args, kill_on_cancel=True, limiter=unlimited)


def _limiters() -> tuple[trio.CapacityLimiter, trio.CapacityLimiter]:
    """Ours (at most SCORING_WORKERS jobs of this trio run), and one that lets trio-parallel
    start a job at once (ours is already held; its default one would wait on other users)."""
    try:
        return _LIMITERS.get()
    except LookupError:
        limiters = (trio.CapacityLimiter(SCORING_WORKERS), trio.CapacityLimiter(math.inf))
        _LIMITERS.set(limiters)
        return limiters

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

A worker is light: it imports the scorers, not the package around them (whose ``__init__``
pulls in torch through the pipeline). Every job reaches it as source and bytes
(:data:`_BOOT`, run by ``eval``, a builtin, so unpickling the job imports nothing of ours),
which first registers ``actorsys`` and ``actorsys.evals`` as bare packages, then imports this
module and runs the job. A name asked of a bare package (a callable scorer that imports
``actorsys``) runs its real ``__init__`` then.

Answers travel in chunks of :data:`CHUNK` (a round trip costs about as much as scoring a few
hundred exact-match answers). A chunk must finish within one answer's ``score_timeout``; one
that does not is scored again answer by answer, so an answer scores 0 for time only when it
alone overran. A worker's first job imports the scorer's modules and scores a sample (sympy
and math-verify's parsers load at their first use), so each call first warms its workers,
bounded by :data:`WARM_TIMEOUT` instead of ``score_timeout``: that budget counts only the
scoring of the answers. A worker that died is replaced by a fresh one, warmed the same way
before it scores again.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import cloudpickle
import trio
import trio_parallel

from actorsys.evals.scorers import Scorer, score, scorer_name
from actorsys.runtime import holding_clock

log = logging.getLogger("actorsys.evals")

SCORING_WORKERS = max(1, min(4, os.cpu_count() or 1))
"""At most this many of our answers are scored at once, each in its own worker process."""
CHUNK = 32
WARM_TIMEOUT = 120.0

Item = tuple[str, Any, Mapping[str, Any] | None]
"""One answer to score: its text, its label, its record (None for the built-in scorers)."""

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
        failure = await _warm(scorer, SCORING_WORKERS)
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
    await _warm(scorer, 1)
    return [scored for item in items for scored in await _score_chunk(scorer, [item], score_timeout)]


async def _warm(scorer: Scorer, workers: int) -> str | None:
    """Start (or find warm) ``workers`` workers with ``scorer``'s modules imported; why they
    could not, or None."""
    failures: list[str] = []

    async def one() -> None:
        try:
            await _in_worker(WARM_TIMEOUT, warm_up, scorer)
        except trio.TooSlowError:
            failures.append(f"no worker ready within {WARM_TIMEOUT} s")
        except Exception as exc:
            failures.append(repr(exc))

    async with trio.open_nursery() as nursery:
        for _ in range(workers):
            nursery.start_soon(one)
    return failures[0] if failures else None


async def _in_worker(seconds: float, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` (a function of this module) in a light worker once one of ours is free,
    killed after ``seconds`` (:class:`trio.TooSlowError`)."""
    limiter, unlimited = _limiters()
    job = {"_boot": _BOOT, "_root": _PACKAGE_DIR,
           "_job": cloudpickle.dumps((fn.__name__, args), protocol=pickle.HIGHEST_PROTOCOL)}
    async with limiter:
        with trio.fail_after(seconds):
            result: T = await trio_parallel.run_sync(
                eval, _RUN, job, kill_on_cancel=True, limiter=unlimited
            )
            return result


def _limiters() -> tuple[trio.CapacityLimiter, trio.CapacityLimiter]:
    """Ours (at most SCORING_WORKERS jobs of this trio run), and one that lets trio-parallel
    start a job at once (ours is already held; its default one would wait on other users)."""
    try:
        return _LIMITERS.get()
    except LookupError:
        limiters = (trio.CapacityLimiter(SCORING_WORKERS), trio.CapacityLimiter(math.inf))
        _LIMITERS.set(limiters)
        return limiters


def score_batch(scorer: Scorer, items: Sequence[Item]) -> list[tuple[float, str | None]]:
    """Runs in a worker: score every item, catching whatever each scorer raises
    (``BaseException`` included: a scorer's ``sys.exit()`` or ``KeyboardInterrupt`` scores
    that answer 0 like any other error, and the worker scores on)."""
    scored: list[tuple[float, str | None]] = []
    for answer, label, record in items:
        try:
            scored.append((score(scorer, answer, label, record), None))
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt too: a 0
            scored.append((0.0, f"scorer {scorer_name(scorer)} raised {exc!r}"[:1000]))
    return scored


def warm_up(scorer: Scorer) -> int:
    """Runs in a worker: import what ``scorer`` needs and score a sample with math-verify where
    it grades (its parsers load at first use); the worker's pid."""
    if scorer == "math" or getattr(scorer, "needs_math", False):  # a dataset's Grader
        score("math", "\\boxed{1}", "1")
    return os.getpid()


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RUN = "exec(_boot) or _result"
_BOOT = """
import importlib, os, pickle, sys, types


def _bare_package(name, path):
    if name in sys.modules:
        return
    module = types.ModuleType(name)
    module.__path__ = [path]
    module.__file__ = os.path.join(path, "__init__.py")

    def __getattr__(attr):
        # `from actorsys.evals import scorers` asks the package before importing the submodule
        if os.path.exists(os.path.join(path, attr + ".py")) or os.path.isfile(
            os.path.join(path, attr, "__init__.py")
        ):
            return importlib.import_module(name + "." + attr)
        if module.__dict__.get("_actorsys_init_ran"):
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        module._actorsys_init_ran = True
        with open(module.__file__, encoding="utf-8") as f:
            exec(compile(f.read(), module.__file__, "exec"), module.__dict__)
        return getattr(module, attr)

    module.__getattr__ = __getattr__
    sys.modules[name] = module


_bare_package("actorsys", _root)
_bare_package("actorsys.evals", os.path.join(_root, "evals"))
_pool = importlib.import_module("actorsys.evals.scoring_pool")

_name, _args = pickle.loads(_job)
_result = getattr(_pool, _name)(*_args)
"""
"""What a worker runs for every job (``eval(_RUN, job)``): see the module's docstring."""

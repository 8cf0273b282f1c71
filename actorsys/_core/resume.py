"""Resume: what a supervisor does at open with the points a crashed run left unsettled.

The journal (:mod:`actorsys._core.journal`) shows the points an earlier run admitted and never
settled: it was killed with them in flight. At open, before the first ``submit``:

- with ``EvalConfig(resume=True)``, each of them whose checkpoint is complete is evaluated
  again, at its own step, before any new point (it is launched first, so the Exporter, which
  only checks it, and the FleetPinner, which take points in order, hand it on first). Complete:
  a snapshot of ours is ``step_<N>`` marked ``.complete`` and sealed after the point was
  admitted (so not a snapshot an earlier run left under the same name); a trainer's checkpoint
  is a directory, marked ``.complete`` where the point required the marker (reuse mode does);
- the rest (all of them without ``resume``) settle in the journal ``skipped`` / ``crashed``
  and never reach a sink (they were not evaluated by this run); a snapshot of ours among them
  is retired, only if it is a marked directory of ours directly in ``hf_dir``, and the
  trainer's checkpoints are never touched. (An export the crash cut short is a marked tmp dir,
  which the staging claim swept already.)

A point with no checkpoint (evaluated on the weights an engine serves) is never resumed. A
``submit`` of a step being resumed admits nothing and returns False: the crashed run's point of
that step is evaluated instead. In a ``torch.distributed`` job of several ranks nothing is
resumed (the ranks would have to agree on it): the journal is written and what the crashed run
left is retired as without ``resume``.

:func:`decide` is the decision alone, free of I/O; :func:`close_out` reads the files and settles
the rest, in a worker thread (:func:`open_journal`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import trio

from actorsys import staging
from actorsys._core.journal import Admitted, Journal, journal_path, read_pending, settled_line
from actorsys._jsonl import append_lines
from actorsys.actors.point import Point, Source
from actorsys.config import EvalConfig
from actorsys.runtime import ThreadTracker, run_blocking

log = logging.getLogger("actorsys")

__all__ = ["Decision", "Resumption", "close_out", "decide", "open_journal", "resumed_point"]

CRASHED = "crashed"
CLOCK_SLACK_SECONDS = 1.0
"""A snapshot sealed this long before its point's admitted line still counts as the point's
own (file times and the wall clock may disagree by a tick)."""


@dataclass(frozen=True)
class Decision:
    resume: tuple[Admitted, ...]
    """Evaluated again, by step."""
    rest: tuple[Admitted, ...]
    """Settled ``crashed`` in the journal, by step."""


def decide(
    pending: Sequence[Admitted], *, resume: bool, complete: Callable[[Admitted], bool]
) -> Decision:
    """Which of the ``pending`` points (admitted, never settled) are evaluated again: with
    ``resume``, those with a checkpoint that is ``complete``; the others are the rest."""
    again = [p for p in pending if resume and p.snapshot is not None and _resumable(p) and complete(p)]
    rest = [p for p in pending if p not in again]
    return Decision(tuple(sorted(again, key=_step)), tuple(sorted(rest, key=_step)))


def _step(entry: Admitted) -> int:
    return entry.step


def _resumable(entry: Admitted) -> bool:
    """A source this version knows how to evaluate again from its checkpoint."""
    return entry.source in (Source.WEIGHTS.value, Source.EXPORT.value, Source.CHECKPOINT.value)


def is_complete(entry: Admitted, staging_dir: str | None) -> bool:
    """Whether ``entry``'s checkpoint is there, whole, and its own. Blocking (a few stats)."""
    path = entry.snapshot
    if path is None:
        return False
    if not entry.owned:
        return os.path.isdir(path) and (not entry.require_marker or staging.is_complete(path))
    if not _ours(path, staging_dir) or not staging.is_complete(path):
        return False
    sealed = os.stat(os.path.join(path, staging.COMPLETE)).st_mtime
    return sealed >= entry.time - CLOCK_SLACK_SECONDS


def _ours(path: str, staging_dir: str | None) -> bool:
    """A snapshot directory actorsys made, directly inside ``staging_dir``."""
    return (
        staging_dir is not None
        and os.path.dirname(os.path.abspath(path)) == os.path.abspath(staging_dir)
        and staging.is_ours(path)
    )


def close_out(path: str, staging_dir: str | None, *, resume: bool) -> Decision:
    """Read the journal at ``path``, decide, and settle the rest: their ``settled`` lines
    first (fsynced), then the retire of their snapshots of ours. Returns the decision.
    Blocking (file I/O): :func:`open_journal` runs it in a worker thread."""
    pending = read_pending(path)
    decision = decide(pending, resume=resume, complete=lambda entry: is_complete(entry, staging_dir))
    if decision.rest:
        append_lines(path, [settled_line(entry.step, "skipped", CRASHED) for entry in decision.rest])
    for entry in decision.rest:
        if entry.owned and entry.snapshot is not None and _ours(entry.snapshot, staging_dir):
            # A complete snapshot sealed before this point was admitted is an earlier
            # point's, which settled and may be kept (the ring, the best): left alone.
            stale = staging.is_complete(entry.snapshot) and not is_complete(entry, staging_dir)
            if not stale:
                staging.retire(entry.snapshot)
                log.info("retired %s, left unsettled by a run that crashed", entry.snapshot)
    return decision


def resumed_point(entry: Admitted) -> Point:
    """The point that evaluates ``entry`` again: forced (no overflow policy drops it), its
    snapshot already written (the Exporter only checks it) or its checkpoint given."""
    source = Source(entry.source)
    if source is Source.CHECKPOINT:
        return Point(entry.step, source, True, checkpoint=entry.snapshot,
                     require_marker=entry.require_marker)
    return Point(entry.step, source, True, snapshot=entry.snapshot)


@dataclass(frozen=True)
class Resumption:
    """The journal a supervisor writes (None: nowhere to keep one) and the points it
    evaluates again, by step."""

    journal: Journal | None
    points: tuple[Point, ...] = ()


async def open_journal(
    config: EvalConfig, staging_dir: str | None, tracker: ThreadTracker, *, collective: bool
) -> Resumption:
    """Close out what a crashed run left in the journal (in a worker thread, waited for also
    when cancelled) and return the journal to write and the points to evaluate again. Call it
    once the staging dir is claimed (its lock keeps a live run's journal from being read as a
    crashed one's). Raises nothing for a journal it cannot read or write: that is logged, and
    nothing is resumed."""
    path = journal_path(config, staging_dir)
    if path is None:
        return Resumption(None)
    resume = config.resume and not collective
    if config.resume and collective:
        log.warning("resume is not done in a torch.distributed job of several ranks; what a "
                    "crashed run left unsettled is retired")
    try:
        decision = await run_blocking(
            lambda: close_out(path, staging_dir, resume=resume),
            abandon_on_cancel=False,
            limiter=trio.CapacityLimiter(1),
            description=f"reading the journal {path}",
            tracker=tracker,
        )
    except (OSError, ValueError) as exc:  # UnsafePathError is a ValueError
        log.error("could not read the journal %s (%r); nothing is resumed", path, exc)
        decision = Decision((), ())
    if decision.rest:
        log.warning("steps %s were left unsettled by a run that crashed and are not evaluated%s",
                    ", ".join(str(e.step) for e in decision.rest),
                    "" if resume else " (EvalConfig.resume is off)")
    if decision.resume:
        log.info("resuming steps %s, left unsettled by a run that crashed",
                 ", ".join(str(e.step) for e in decision.resume))
    return Resumption(Journal(path, staging_dir, tracker), tuple(map(resumed_point, decision.resume)))

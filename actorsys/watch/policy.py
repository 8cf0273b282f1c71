"""The watcher's decisions, from what the ledger and the scans say: which checkpoints are due,
which wait for the next generation, what a settled outcome writes to the ledger. No I/O: the
service (:mod:`actorsys.watch.service`) reads and writes around these.

- **Due**: found by the scan, not left behind by ``--catchup latest``, not claimed (submitted
  and not yet recorded), and not settled by the ledger under this eval key within
  ``max_attempts`` (:meth:`~actorsys.watch.ledger.Ledger.due`).
- **Generations**: a supervisor accepts a step once, so a due checkpoint whose step this
  generation already submitted (a retry, or a second directory of that step) waits for the
  next one, opened once nothing is in flight.
- **Retries**: an outcome ``ok`` is done; ``closed`` (cut off by an interrupt) is no attempt
  and writes nothing; a checkpoint whose directory is gone has vanished; any other failure
  is an attempt (``skipped``), and the last allowed one, or one whose requests the server
  refused as malformed (``bad_request``, which can never succeed), also ``failed``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from actorsys.outcome import Outcome
from actorsys.watch.ledger import DONE, FAILED, SKIPPED, VANISHED
from actorsys.watch.scan import Checkpoint

Catchup = Literal["all", "latest"]
CLOSED = "closed"
BAD_REQUEST = "bad_request"
"""A point whose requests the server refused as malformed: it can never succeed, so it is
recorded failed at its first attempt."""


def left_behind(found: Sequence[Checkpoint], catchup: Catchup) -> set[str]:
    """The checkpoints ``--catchup latest`` leaves (all but the newest step's); none for
    ``all``. ``found`` is in step order, as a scan gives it."""
    if catchup != "latest" or not found:
        return set()
    newest = found[-1].step
    return {c.name for c in found if c.step < newest}


def due(
    found: Sequence[Checkpoint],
    *,
    ignored: Collection[str],
    claimed: Collection[str],
    unsettled: Callable[[Checkpoint], bool],
) -> list[Checkpoint]:
    """The checkpoints of ``found`` to evaluate, in its order. ``unsettled(c)``: whether
    the ledger says ``c`` still needs an evaluation."""
    return [c for c in found if c.name not in ignored and c.name not in claimed and unsettled(c)]


def this_generation(
    due: Sequence[Checkpoint], submitted: Collection[int]
) -> tuple[list[Checkpoint], bool]:
    """The checkpoints of ``due`` this generation may submit (one per step, none of a step
    it ``submitted`` already), and whether any must wait for the next generation."""
    take: list[Checkpoint] = []
    steps = set(submitted)
    waiting = False
    for checkpoint in due:
        if checkpoint.step in steps:
            waiting = True
            continue
        steps.add(checkpoint.step)
        take.append(checkpoint)
    return take, waiting


Next = Literal["poll", "next_generation", "stop"]


def after_submitting(*, in_flight: bool, waiting: bool, once: bool) -> Next:
    """What a generation does once it submitted what it could: while anything is in flight,
    poll (outcomes and scans change what is due); then open the next generation if a
    checkpoint waits for one, stop with ``--once``, or poll for new checkpoints."""
    if in_flight:
        return "poll"
    if waiting:
        return "next_generation"
    return "stop" if once else "poll"


@dataclass(frozen=True)
class Settlement:
    """What one outcome writes: ``entries`` for the ledger, ``(status, fields)`` in order;
    ``report``: the :class:`~actorsys.watch.service.WatchReport` list its step joins (None:
    none); ``given_up``: why it is not retried (None: it may be)."""

    entries: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    report: Literal["ok", "failed", "vanished"] | None = None
    given_up: str | None = None


def needs_presence_check(ok: bool, reason: str | None) -> bool:
    """Whether a settled outcome is an attempt whose checkpoint may have vanished (the
    service then looks for its directory)."""
    return not ok and reason != CLOSED


def settle(
    ok: bool,
    reason: str | None,
    *,
    vanished: bool,
    attempts: int,
    max_attempts: int,
    error: str | None = None,
) -> Settlement:
    """The ledger entries of an outcome (``ok``, skip ``reason``, ``error``) of a checkpoint
    the ledger counted ``attempts`` failed attempts of before this one."""
    if ok:
        return Settlement([(DONE, {})], report="ok")
    if reason == CLOSED:
        return Settlement()
    if vanished:
        return Settlement([(VANISHED, {"reason": reason})], report="vanished")
    skipped = (SKIPPED, {"reason": reason})
    if reason == BAD_REQUEST:
        return Settlement([skipped, (FAILED, {"reason": reason, "error": error})],
                          report="failed",
                          given_up=f"can never be evaluated as asked ({reason}: {error})")
    if attempts + 1 >= max_attempts:
        return Settlement([skipped, (FAILED, {"reason": reason})], report="failed",
                          given_up=f"failed {attempts + 1} times ({reason})")
    return Settlement([skipped])


def error_of(outcome: Outcome) -> str | None:
    """The first error message an outcome carries (``data["error"]``), or None."""
    data = outcome.data
    error = data.get("error") if isinstance(data, dict) else None
    return None if error is None else str(error)

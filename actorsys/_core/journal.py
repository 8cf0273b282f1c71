"""The journal of a supervisor's points: what it admitted and what settled, kept across a crash.

One JSON object a line, in ``hf_dir/journal.jsonl`` (in reuse mode, beside the trainer's
checkpoints: :func:`journal_path`)::

    {"event": "admitted", "step": 20, "source": "weights", "snapshot": "/dev/shm/eval/step_20",
     "owned": true, "require_marker": false, "resumed": false, "time": 1764750000.1}
    {"event": "settled", "step": 20, "status": "ok", "reason": null}

``snapshot`` is where the point's checkpoint is (or will be, once exported): what evaluating it
again needs, with ``source`` and ``require_marker``; ``owned`` says actorsys writes it (and so
may retire it). A point with no checkpoint (one evaluated on the weights an engine serves) is
journaled with ``snapshot`` null and is never evaluated again.

Admission queues the admitted line as it launches a point, the Retirer the settled line as
the point settles, after its sink has the outcome. Queuing is sync and touches no file. The
lines are written by :meth:`Journal.write_pending`, always in a worker thread, whole and
fsynced (:func:`actorsys._jsonl.append_lines`) and in the order they were queued (one writer
at a time takes every queued line): by the journal's writer task (:meth:`Journal.run`, in the
Retirer's nursery) as soon as lines are queued, and by the Retirer's delete thread before it
deletes anything, so a snapshot is never gone while its point is still unsettled on disk. A
crash leaves at most a torn last line, which :func:`read_pending` ignores.

Replaying the file (:func:`read_pending`), a step's last ``admitted`` line opens it and its next
``settled`` line closes it: the points left open are those a crashed run admitted and never
settled (:mod:`actorsys._core.resume` decides what becomes of them).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import trio

from actorsys import staging
from actorsys._jsonl import append_lines, encode_line, read_lines
from actorsys.actors.point import Point, Source
from actorsys.config import EvalConfig
from actorsys.outcome import Outcome
from actorsys.runtime import ThreadTracker, run_blocking

log = logging.getLogger("actorsys")

__all__ = ["JOURNAL_NAME", "REUSE_JOURNAL_NAME", "Admitted", "Journal", "journal_path",
           "read_pending", "settled_line"]

JOURNAL_NAME = "journal.jsonl"
REUSE_JOURNAL_NAME = ".actorsys-journal.jsonl"
ADMITTED, SETTLED = "admitted", "settled"
STEP = "{step}"


def journal_path(config: EvalConfig, staging_dir: str | None) -> str | None:
    """Where a supervisor of ``config`` keeps its journal: ``<hf_dir>/journal.jsonl``; in reuse
    mode (``save_hf`` with no ``hf_dir``) ``.actorsys-journal.jsonl`` in the deepest directory
    of the ``save_hf`` pattern that holds every step's checkpoint (``/ckpt/hf/{step}`` ->
    ``/ckpt/hf``; ``/ckpt/step_{step}/hf`` -> ``/ckpt``); None with neither."""
    if staging_dir is not None:
        return os.path.join(staging_dir, JOURNAL_NAME)
    if config.save_hf is None:
        return None
    prefix = config.save_hf[: config.save_hf.index(STEP)]
    return os.path.join(os.path.abspath(os.path.dirname(prefix) or "."), REUSE_JOURNAL_NAME)


@dataclass(frozen=True)
class Admitted:
    """A point as its ``admitted`` line tells it."""

    step: int
    source: str
    snapshot: str | None
    owned: bool
    require_marker: bool
    time: float


def admitted_line(point: Point, staging_dir: str | None, *, resumed: bool) -> str:
    """The ``admitted`` line of ``point``: where its checkpoint is or will be (``step_<N>`` in
    ``staging_dir`` for an export, the given path for a trainer's checkpoint, else null)."""
    snapshot: str | None
    if point.source in (Source.WEIGHTS, Source.EXPORT) and staging_dir is not None:
        snapshot = point.snapshot or staging.final_dir(staging_dir, point.step)
    else:
        snapshot = point.checkpoint
    return encode_line({
        "event": ADMITTED, "step": point.step, "source": point.source.value,
        "snapshot": snapshot, "owned": point.source is not Source.CHECKPOINT and snapshot is not None,
        "require_marker": point.require_marker, "resumed": resumed, "time": time.time(),
    })


def settled_line(step: int, status: str, reason: str | None) -> str:
    return encode_line({"event": SETTLED, "step": step, "status": status, "reason": reason})


class Journal:
    """The journal file at ``path`` and the lines queued for it.

    :meth:`admitted` and :meth:`settled` are called in the trio thread and only queue;
    :meth:`write_pending` writes in whichever worker thread calls it; :meth:`run` and
    :meth:`flush` are the trio side that has it called."""

    def __init__(self, path: str, staging_dir: str | None, tracker: ThreadTracker) -> None:
        self.path = path
        self.staging_dir = staging_dir
        self.tracker = tracker
        self._lines: deque[str] = deque()  # appended in the trio thread, taken by the writer
        self._writing = threading.Lock()  # one writer at a time, so lines keep their order
        self._queued = trio.lowlevel.ParkingLot()
        self._limiter = trio.CapacityLimiter(1)
        self._failed = False

    def __repr__(self) -> str:
        return f"Journal({self.path!r})"

    def admitted(self, point: Point, *, resumed: bool = False) -> None:
        """Queue the ``admitted`` line of ``point``. Sync, touches no file."""
        self._queue(admitted_line(point, self.staging_dir, resumed=resumed))

    def settled(self, outcome: Outcome) -> None:
        """Queue the ``settled`` line of ``outcome``'s point. Sync, touches no file."""
        self._queue(settled_line(outcome.step, outcome.status, outcome.reason))

    def _queue(self, line: str) -> None:
        self._lines.append(line)
        self._queued.unpark_all()

    @property
    def pending(self) -> int:
        """Lines queued and not yet written."""
        return len(self._lines)

    def write_pending(self) -> None:
        """Append every line queued so far, in one write, fsynced. Blocking (disk I/O): only
        ever called in a worker thread. A failed write is logged (once) and its lines lost:
        the journal never stops a point from settling."""
        with self._writing:
            lines = []
            while self._lines:
                lines.append(self._lines.popleft())
            if not lines:
                return
            try:
                append_lines(self.path, lines)
            except (OSError, ValueError) as exc:  # UnsafePathError is a ValueError
                if not self._failed:
                    self._failed = True
                    log.error("could not write the journal %s (%r): points that settle now "
                              "may be evaluated again after a crash", self.path, exc)

    async def flush(self) -> None:
        """Write what is queued, in a worker thread; waited for also when cancelled (a line
        half done would be torn)."""
        if not self._lines:
            return
        await run_blocking(
            self.write_pending,
            abandon_on_cancel=False,
            limiter=self._limiter,
            description=f"write of the journal {self.path}",
            tracker=self.tracker,
        )

    async def run(self) -> None:
        """Write lines as they are queued, until cancelled."""
        while True:
            while not self._lines:
                await self._queued.park()
            await self.flush()


def read_pending(path: str) -> list[Admitted]:
    """The points the journal at ``path`` shows admitted and never settled, by step; a missing
    file shows none. Lines that are not whole (a torn last line) or not the journal's are
    ignored, with a warning. Blocking (reads the file)."""
    try:
        lines = read_lines(path, private=True)
    except FileNotFoundError:
        return []
    return fold(path, [(line.number, line.row) for line in lines])


def fold(path: str, rows: Iterable[tuple[int, dict[str, Any] | None]]) -> list[Admitted]:
    """Replay ``rows`` (line number, JSON object or None) in order: the open points."""
    open_points: dict[int, Admitted] = {}
    for number, row in rows:
        event = None if row is None else row.get("event")
        step = None if row is None else row.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            event = None
        if event == SETTLED:
            assert isinstance(step, int)
            open_points.pop(step, None)
        elif event == ADMITTED and row is not None and (entry := _admitted(row)) is not None:
            open_points[entry.step] = entry
        else:
            log.warning("%s line %d is not a whole journal line; ignored", path, number)
    return [open_points[step] for step in sorted(open_points)]


def _admitted(row: dict[str, Any]) -> Admitted | None:
    snapshot, stamp = row.get("snapshot"), row.get("time")
    if (not isinstance(row.get("source"), str) or not (snapshot is None or isinstance(snapshot, str))
            or not isinstance(stamp, int | float) or isinstance(stamp, bool)):
        return None
    return Admitted(
        step=row["step"], source=row["source"], snapshot=snapshot, owned=row.get("owned") is True,
        require_marker=row.get("require_marker") is True, time=float(stamp),
    )

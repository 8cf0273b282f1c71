"""Whether a point's weights fit on the staging dir's file system, decided off the stall.

A point's weights are admitted only if they fit beside the exports still to be written, with
``DISK_HEADROOM_BYTES`` to spare. Reading the free space (``statvfs``) on every submit costs the
trainer a thread hand-off on its stall (0.5 ms on a quiet machine, tens of milliseconds on a
busy one), so admission decides on an estimate instead, and reads the file system itself only
when the estimate comes close to the budget.

The estimate. A reader thread reads the free space every ``READ_EVERY_SECONDS``; beside each
reading it keeps how many bytes of admitted points had *left the exporter* (written, failed
or dropped) before it read. Every other admitted point may still write all its bytes after
the reading, so::

    room = reading + left before the reading - every byte admitted so far - headroom

never overstates the room our own snapshots leave (deletions since the reading only make it
err low until the next one). Admission trusts it when the point fits with
``margin_bytes`` to spare and the reading is at most ``TRUST_SECONDS`` old; otherwise it reads
``statvfs`` in a worker thread, waited for (a reading the estimate then starts from), and
decides on the exact count as before, so a point that does not fit is refused before anything
is copied. What no estimate sees (another process filling the disk since the reading) is what
the margin is for; a write that still fails settles the point ``export_failed``, counted like
any skip.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

import trio

from actorsys import staging
from actorsys.runtime import ThreadTracker, run_blocking

DISK_HEADROOM_BYTES = 64 * 1024 * 1024
DISK_MARGIN_BYTES = 1024 * 1024 * 1024
READ_EVERY_SECONDS = 1.0
TRUST_SECONDS = 5.0


def margin_bytes(nbytes: int) -> int:
    """How far clear of the budget a point of ``nbytes`` must be for the estimate to admit it:
    at least 1 GiB, and at least the point's own size."""
    return max(DISK_MARGIN_BYTES, nbytes)


class DiskRoom:
    """The free space of ``staging_dir``, estimated; ``pending()`` (trio thread) counts the
    bytes of the exports still to be written, for the exact check."""

    def __init__(self, staging_dir: str, pending: Callable[[], int], tracker: ThreadTracker) -> None:
        self.staging_dir = staging_dir
        self._pending = pending
        self._tracker = tracker
        self._limiter = trio.CapacityLimiter(1)
        self._admitted = 0
        """Bytes of every point admitted so far (written by the trio thread only)."""
        self._left = 0
        """Bytes of every admitted point that left the exporter or was never launched."""
        self._reading: tuple[int, float] | None = None
        """(free bytes + ``_left`` before the read, when it was read), from the reader thread."""
        self._stop = threading.Event()
        self._reader: threading.Thread | None = None
        self.exact_reads = 0
        """How many decisions read the file system on the stall (the others used the estimate)."""

    def estimate(self) -> int | None:
        """The room the estimate sees for another point, or None without a fresh reading."""
        reading = self._reading
        if reading is None or time.monotonic() - reading[1] > TRUST_SECONDS:
            return None
        return reading[0] - self._admitted - DISK_HEADROOM_BYTES

    async def has_room(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit; if so, they count as admitted until ``left``."""
        self._start_reader()
        room = self.estimate()
        if room is None or room - nbytes < margin_bytes(nbytes):
            self.exact_reads += 1
            free = await run_blocking(
                functools.partial(self.read, raises=True),
                abandon_on_cancel=False,
                limiter=self._limiter,
                description=f"free space of {self.staging_dir}",
                tracker=self._tracker,
            )
            assert free is not None
            if free - self._pending() - DISK_HEADROOM_BYTES < nbytes:
                return False
        self._admitted += nbytes
        return True

    def left(self, nbytes: int) -> None:
        """``nbytes`` of an admitted point will not be written any more: it left the exporter,
        or it was never launched (trio thread)."""
        self._left += nbytes

    def read(self, *, raises: bool = False) -> int | None:
        """One reading (blocking: the reader thread's, or a worker thread's for an exact
        decision): the free bytes, kept for the estimate. A file system that cannot be read
        leaves no reading; then None, or the ``OSError`` with ``raises``."""
        left = self._left
        try:
            free = staging.free_bytes(self.staging_dir)
        except OSError:
            self._reading = None
            if raises:
                raise
            return None
        self._reading = (free + left, time.monotonic())
        return free

    def stop(self) -> None:
        """Stop the reader thread (it ends within a reading). Idempotent."""
        self._stop.set()

    def _start_reader(self) -> None:
        if self._reader is None and not self._stop.is_set():
            self._reader = threading.Thread(
                target=self._read_until_stopped, name="actorsys free space", daemon=True
            )
            self._reader.start()

    def _read_until_stopped(self) -> None:
        while not self._stop.is_set():
            self.read()
            self._stop.wait(READ_EVERY_SECONDS)

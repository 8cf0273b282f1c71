"""One ``watch`` per output directory: ``OUT/.lock``, held while it runs.

The lock is :class:`actorsys._lock.PidLock` (``fcntl.flock``, the holder's pid in the file, for
the message a second watch prints; never opened through a link). The file stays after release:
a stale one locks nothing.
"""

from __future__ import annotations

import os

from actorsys._errors import WatchOutInUseError
from actorsys._lock import PidLock

LOCK_NAME = ".lock"


class OutLock:
    """The lock of ``out`` (a directory that exists). :meth:`acquire` takes it or raises
    :class:`WatchOutInUseError` naming the holder's pid, never waiting for the holder; it is
    blocking (it creates, writes and fsyncs the file). :meth:`release` only closes it."""

    def __init__(self, out: str) -> None:
        self.path = os.path.join(out, LOCK_NAME)
        self._lock = PidLock(self.path, lambda pid: WatchOutInUseError(self.path, pid))

    def acquire(self) -> None:
        self._lock.acquire()

    def release(self) -> None:
        self._lock.release()

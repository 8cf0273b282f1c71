"""One ``watch`` per output directory: ``OUT/.lock``, held with ``flock`` while it runs.

The lock is the kernel's (``fcntl.flock`` on an open file), so it is released when its holder
exits however it exits, and a stale file from a killed watch locks nothing. The holder writes
its pid into the file, for the message a second watch prints. The file is opened without
following links (``_files.open_private``): a link planted as ``OUT/.lock`` is refused, never
truncated through.
"""

from __future__ import annotations

import fcntl
import os

from actorsys._errors import WatchOutInUseError
from actorsys._files import open_private

LOCK_NAME = ".lock"


class OutLock:
    """The lock of ``out`` (a directory that exists). :meth:`acquire` takes it or raises
    :class:`WatchOutInUseError` naming the holder's pid, never waiting for the holder; it is
    blocking (it creates, writes and fsyncs the file). :meth:`release` only closes it."""

    def __init__(self, out: str) -> None:
        self.path = os.path.join(out, LOCK_NAME)
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = open_private(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _pid_in(fd)
            os.close(fd)
            raise WatchOutInUseError(self.path, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def _pid_in(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else None

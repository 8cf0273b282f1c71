"""The one OS file lock of actorsys: a lock file held with ``fcntl.flock``, the holder's pid in it.

The staging dir (``<hf_dir>/.actorsys.lock``) and a watch's output directory (``OUT/.lock``)
are each held by one job at a time through a :class:`PidLock`. The lock is the kernel's, so it
is released when its holder exits however it exits, and a stale file from a killed holder locks
nothing. Taking it never waits: a held lock raises the caller's own error, made from the
holder's pid (None when it wrote none). The file is opened without following links
(:func:`~actorsys._files.open_private`): a link planted under its name is refused, never
truncated through.

A lock file may be removed at release (``release(remove=True)``, while still locked). An
opener that locked a file since removed finds that its path names another file now and tries
again, so two openers can never both hold it. Everything here blocks on the file system.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable

from actorsys._files import open_private

__all__ = ["PidLock"]


class PidLock:
    """The lock file at ``path`` (its directory exists). :meth:`acquire` takes it or raises
    ``in_use(pid)``; :meth:`release` gives it back. Blocking."""

    def __init__(self, path: str, in_use: Callable[[int | None], BaseException]) -> None:
        self.path = path
        self._in_use = in_use
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock and write this process's pid into the file (fsynced). Blocking: the
        staging claim and watch's OUT lock take it in a worker thread, never on the trio
        thread."""
        while True:
            fd = open_private(self.path, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if _names(self.path, fd):
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                    os.fsync(fd)
                    self._fd = fd
                    return
            except BlockingIOError:
                pid = _holder(fd)
                os.close(fd)
                raise self._in_use(pid) from None
            except BaseException:
                os.close(fd)
                raise
            # The holder released (and removed) this file between our open and our lock.
            os.close(fd)

    def release(self, *, remove: bool = False) -> None:
        """Give the lock back (closing its file releases it), removing the file first with
        ``remove``. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if remove:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        finally:
            os.close(fd)


def _names(path: str, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def _holder(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else None

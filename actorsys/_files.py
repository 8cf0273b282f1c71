"""Opening a file of ours safely: never through a link, never someone else's file.

Lock files, ledgers, metrics and logs live in directories a user names (``OUT``, ``hf_dir``,
a log dir). A link another local user planted under our file's name (``OUT/.lock`` pointing
at ``~/.bashrc``) must not make us truncate or append to its target, and a directory others
may write (a shared one without the sticky bit) lets them swap our file for theirs at any
time. :func:`open_private` is the one way such a file is opened::

    fd = open_private(os.path.join(out, ".lock"), os.O_RDWR | os.O_CREAT)

It opens with ``O_NOFOLLOW`` (a symlink in the last component fails), then checks with
``fstat`` on the open descriptor (no race with a rename) that it is a regular file owned by
this user with one link (a hard link to another user's file is refused), and only then
truncates it if ``O_TRUNC`` was asked for. A refused file or directory raises
:class:`UnsafePathError`, a :class:`~actorsys.ConfigError` naming the path and what is wrong.
"""

from __future__ import annotations

import os
import stat
import uuid

from actorsys._errors import UnsafePathError

__all__ = ["UnsafePathError", "check_directory", "fsync_directory", "open_private", "replace_file"]


def check_directory(directory: str) -> None:
    """Raise :class:`UnsafePathError` when ``directory`` is writable by every user without
    the sticky bit (anyone could rename our files there) or owned by another user than this
    one or root. Blocking (one ``stat``)."""
    info = os.stat(directory)
    if info.st_uid not in (os.geteuid(), 0):
        raise UnsafePathError(directory, f"the directory belongs to user {info.st_uid}, not "
                                         "to this user; use a directory of your own")
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        raise UnsafePathError(directory, "every user may write this directory (and it has no "
                                         "sticky bit), so anyone could replace a file of ours "
                                         "in it; use a directory of your own, or chmod o-w it")


def open_private(path: str, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags | O_NOFOLLOW | O_CLOEXEC, mode)`` for a regular file of this
    user's, in a directory :func:`check_directory` accepts; ``O_TRUNC`` is applied only after
    the checks. Returns the descriptor. Raises :class:`UnsafePathError` for a link, a
    non-regular file, another user's file or a file with several links; ``OSError`` as
    ``os.open`` does otherwise. Blocking."""
    check_directory(os.path.dirname(os.path.abspath(path)))
    truncate = bool(flags & os.O_TRUNC)
    try:
        # O_NONBLOCK: a FIFO planted under the name must not block the open (it is refused
        # below); it changes nothing for a regular file and is cleared once checked.
        fd = os.open(path, (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     mode)
    except OSError as exc:
        try:
            kind = os.lstat(path).st_mode
        except OSError:
            raise exc from None
        if stat.S_ISLNK(kind):
            raise UnsafePathError(path, "it is a symbolic link; remove it (a file of ours is "
                                        "never opened through a link)") from exc
        if not stat.S_ISREG(kind):
            raise UnsafePathError(path, "it is not a regular file; remove it") from exc
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePathError(path, "it is not a regular file; remove it")
        if info.st_uid != os.geteuid():
            raise UnsafePathError(path, f"the file belongs to user {info.st_uid}, not to this "
                                        "user; remove it")
        if info.st_nlink > 1:
            raise UnsafePathError(path, f"the file has {info.st_nlink} hard links; remove it")
        os.set_blocking(fd, True)
        if truncate:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def fsync_directory(path: str) -> None:
    """Make the entries of ``path`` durable (a rename or a new file in it). Blocking."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably: a fresh private file beside it
    (:func:`open_private`), fsynced, renamed over it, the rename fsynced. A reader sees the
    old file or the new, never part of one; a failure leaves no tmp file. Blocking."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_directory(directory)

"""Child processes that leave no orphans: each in its own process group, behind a reaper.

``spawn`` starts ``_reaper.py`` in a new session; the reaper runs the command in that process
group and kills the whole group when the owner dies (``PR_SET_PDEATHSIG``), so an engine and
everything it started (vLLM's engine core, say) go away also when the owner crashes or is
killed. ``ManagedProcess.stop`` is the orderly path: SIGTERM to the group, SIGKILL after a
grace period.

The kernel ties ``PR_SET_PDEATHSIG`` to the *thread* that forked, so ``spawn`` forks from the
calling thread (the trio thread, which lives as long as its owner) and not from a worker
thread the way ``trio.run_process`` does: a cached worker thread that exits after a few idle
seconds would take the engine with it. A trio owner calls :func:`start`, which opens the log
in a worker thread first (no file is opened on the trio thread); ``spawn`` is for an owner
that is not a trio program (a Ray actor's thread).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from functools import partial

import trio

from actorsys._files import open_private
from actorsys.runtime import ThreadTracker, run_blocking

REAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reaper.py")
LOG_READ_TIMEOUT = 5.0
GROUP_POLL_SECONDS = 0.02
"""Seconds :meth:`ManagedProcess.read_log_tail` waits for a log on a hung filesystem."""


class ManagedProcess:
    """A command running under its reaper, in a process group of its own."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log_path: str | None) -> None:
        self.name = name
        self.log_path = log_path
        self._popen = popen
        self.pid = popen.pid
        self.pgid = popen.pid
        self.threads = ThreadTracker()
        """Reads of the log still running in a worker thread (see :meth:`read_log_tail`)."""
        self._log_reads: trio.CapacityLimiter | None = None

    def __repr__(self) -> str:
        return f"ManagedProcess({self.name!r}, pid={self.pid}, returncode={self.returncode})"

    @property
    def returncode(self) -> int | None:
        """None while the reaper runs, else its exit status (the command's, or -signal)."""
        return self._popen.poll()

    def command_pid(self) -> int | None:
        """The pid of the command itself (the reaper's child), or None once it has ended."""
        try:
            with open(f"/proc/{self.pid}/task/{self.pid}/children", encoding="ascii") as f:
                children = f.read().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to every process of the group; nothing if it is gone."""
        try:
            os.killpg(self.pgid, signum)
        except ProcessLookupError:
            pass

    async def wait(self) -> int:
        """Block until the reaper has exited (and is reaped); return its status.

        Waits on a pidfd, so it costs no thread and cancels at once.
        """
        if self.returncode is None:
            fd = os.pidfd_open(self.pid)
            try:
                while self.returncode is None:
                    await trio.lowlevel.wait_readable(fd)
            finally:
                os.close(fd)
        else:
            await trio.lowlevel.checkpoint()  # a wait is always a checkpoint, also when done
        status = self.returncode
        assert status is not None
        return status

    def wait_blocking(self) -> int:
        """Block the calling thread until the reaper has exited; return its status. For an
        owner that is not a trio program (an engine actor's watcher thread)."""
        return self._popen.wait()

    async def stop(self, grace: float) -> None:
        """SIGTERM the group, SIGKILL it after ``grace`` seconds; return once the reaper is
        reaped. Shielded from cancellation: it always finishes, within about ``grace``."""
        with trio.CancelScope(shield=True):
            if self.returncode is None:
                self.signal_group(signal.SIGTERM)
                with trio.move_on_after(grace):
                    await self.wait()
            self.signal_group(signal.SIGKILL)
            with trio.move_on_after(max(grace, 1.0)):
                await self.wait()
                # The reaper is gone, but a killed member of its group (an engine's own child)
                # dies a moment later: return once the group is empty, so no process of ours
                # outlives the stop.
                while self._group_alive():  # noqa: ASYNC110 - the kernel has no event for it
                    await trio.sleep(GROUP_POLL_SECONDS)

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    async def read_log_tail(self, size: int = 4000) -> str:
        """:meth:`log_tail` from trio: read in a worker thread, one read at a time, given up
        (the thread left to end on its own) after ``LOG_READ_TIMEOUT`` seconds."""
        if self._log_reads is None:
            self._log_reads = trio.CapacityLimiter(1)
        with trio.move_on_after(LOG_READ_TIMEOUT):
            return await run_blocking(
                partial(self.log_tail, size), abandon_on_cancel=True, limiter=self._log_reads,
                description=f"read the log of {self.name}", tracker=self.threads,
            )
        return f"(its log {self.log_path} was not read within {LOG_READ_TIMEOUT} s)"

    def log_tail(self, size: int = 4000) -> str:
        """The last ``size`` characters of the process's log, for error messages. Blocking:
        from trio, :meth:`read_log_tail`."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - size))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""


def spawn(
    name: str,
    command: Sequence[str],
    *,
    log_path: str | None = None,
    env: Mapping[str, str] | None = None,
    grace: float = 5.0,
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
    log_fd: int | None = None,
) -> ManagedProcess:
    """Start ``command`` under a reaper in a new process group; output goes to ``log_path``
    (appended to; a link or another user's file there raises ``UnsafePathError``), or to
    ``log_fd`` (``log_path`` opened already, by :func:`open_log`; closed here).
    ``pass_fds``: descriptors the command inherits, at the same numbers (a listening socket
    the caller bound, see ``_port``); no other descriptor of this process reaches it.

    Blocks the calling thread for the fork and exec (milliseconds). See the module docstring
    for why it must be called from the thread that owns the process.
    """
    fds = [f"--pass-fds={','.join(str(fd) for fd in pass_fds)}"] if pass_fds else []
    argv = [sys.executable, "-I", REAPER, str(os.getpid()), str(grace), *fds, "--", *command]
    environment = dict(os.environ if env is None else env)
    if log_path is not None and log_fd is None:
        log_fd = open_log(log_path)
    if log_fd is not None:
        with os.fdopen(log_fd, "ab") as log:
            popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=environment, cwd=cwd, pass_fds=tuple(pass_fds),
            )
    else:
        popen = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, start_new_session=True, env=environment, cwd=cwd,
            pass_fds=tuple(pass_fds),
        )
    return ManagedProcess(name, popen, log_path)


def open_log(path: str) -> int:
    """A descriptor appending to ``path`` (created private; a link or another user's file
    raises ``UnsafePathError``). Blocking: a file operation."""
    return open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)


async def start(
    name: str,
    command: Sequence[str],
    *,
    log_path: str | None = None,
    env: Mapping[str, str] | None = None,
    grace: float = 5.0,
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
) -> ManagedProcess:
    """``spawn`` for a trio owner: opens ``log_path`` in a worker thread (waited for when
    cancelled, so no descriptor is left open), then forks from the calling (trio) thread."""
    log_fd = None
    if log_path is not None:
        log_fd = await run_blocking(
            partial(open_log, log_path), abandon_on_cancel=False,
            limiter=trio.CapacityLimiter(1), description=f"opening {log_path}",
            tracker=ThreadTracker(),
        )
    return spawn(name, command, log_path=log_path, env=env, grace=grace, cwd=cwd,
                 pass_fds=pass_fds, log_fd=log_fd)

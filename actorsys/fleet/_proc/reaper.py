"""Guards one engine process so that it never outlives its owner.

Run as a script (``python _reaper.py OWNER_PID GRACE [--pass-fds=FD,...] -- COMMAND...``; the
listed descriptors reach COMMAND at the same numbers), never imported by the
owner: it must start fast and light. It leads the process group the owner created for it and
runs COMMAND in that group. It asks the kernel for SIGTERM when the owner's thread that
started it ends (``PR_SET_PDEATHSIG``), which covers an owner that crashes or is killed; it then
stops the whole group: SIGTERM, then SIGKILL after GRACE seconds. When COMMAND ends by itself,
whatever it left in the group is stopped the same way and the reaper exits with its status.

COMMAND itself gets SIGKILL from the kernel if the reaper dies first (``PR_SET_PDEATHSIG``
again): a reaper that is SIGKILLed has no chance to stop the group, and Ray, for one, SIGKILLs
the children of an actor's worker when the actor is killed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1


def _exited(pid: int) -> bool:
    """Whether the command has ended, without reaping it. ``Popen.poll`` cannot tell from
    inside the SIGTERM handler: the interrupted ``Popen.wait`` holds its lock, so ``poll``
    answers None until the grace runs out."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _stop_group(child: subprocess.Popen[bytes], grace: float) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while not _exited(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(0, signal.SIGKILL)


def main(argv: list[str]) -> int:
    pass_fds: tuple[int, ...] = ()
    if len(argv) > 2 and argv[2].startswith("--pass-fds="):
        pass_fds = tuple(int(fd) for fd in argv[2].partition("=")[2].split(","))
        argv = [*argv[:2], *argv[3:]]
    if len(argv) < 4 or argv[2] != "--":
        print("usage: _reaper.py OWNER_PID GRACE [--pass-fds=FD,...] -- COMMAND...",
              file=sys.stderr)
        return 2
    owner, grace, command = int(argv[0]), float(argv[1]), argv[3:]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != owner:
        return 1
    reaper = os.getpid()

    def die_with_reaper() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != reaper:
            os._exit(1)

    child = subprocess.Popen(command, preexec_fn=die_with_reaper, pass_fds=pass_fds)
    for fd in pass_fds:
        os.close(fd)  # the command holds them now; the reaper has no use for them

    def on_term(signum: int, frame: object) -> None:
        _stop_group(child, grace)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    status = child.wait()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

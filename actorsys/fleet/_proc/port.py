"""A server's port, held before anyone can see it.

A port picked free, closed, and bound again by the server seconds later (after it imported
torch) is open to any local user in between: whoever binds it first answers ``/health``,
which needs no key, and from then on receives every request with the fleet's key. Two ways
close that window here:

- **The parent binds, the child inherits** (:func:`held_listener`): the fleet binds a
  listening socket on port 0 and hands its descriptor to the server (``pass_fds``; the
  embedded engine serves it with ``--listen-fd``, vLLM through ``actorsys_vllm_serve``). The
  port is ours from the first moment and, since the fleet keeps its copy, stays ours across
  restarts: connections made while a server restarts wait in the backlog for the next one.
- **The listener is proven ours** (:func:`owns_port`), for a server that binds its own port
  (sglang-router, an argv ``ServerEvalFn`` launches): nothing is sent to it, not even
  ``/health``, until the socket that listens on its port is one of the descriptors of the
  process group we started. A squatter's socket is in no process of ours; a squatter that
  bound first makes the server fail to bind, and the wait ends with its exit.

The proof reads ``/proc/net/tcp*`` (every socket's port and inode) and ``/proc/PID/fd`` of
the group's processes (links ``socket:[INODE]``), which this user can read for its own
processes: Linux only, as is the rest of the process handling.
"""

from __future__ import annotations

import os
import socket
from functools import partial

import trio

from actorsys.fleet._proc.process import ManagedProcess
from actorsys.runtime import run_blocking

LISTEN = "0A"
"""The state of a listening socket in ``/proc/net/tcp``."""


def held_listener(
    host: str = "127.0.0.1", port: int = 0, *, reuse_address: bool = False
) -> socket.socket:
    """A TCP socket bound to ``host`` on ``port`` (0: one the kernel picks, so the port is
    ours before anyone learns its number), listening. Pass its ``fileno()`` to the server
    with ``pass_fds`` and keep it open as long as the server may be restarted on it.
    ``reuse_address`` sets ``SO_REUSEADDR`` before the bind. Raises ``OSError`` (the port is
    taken, the address is not this machine's), the socket closed."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def inherited_listener(fd: int) -> socket.socket:
    """The listening TCP socket at descriptor ``fd``, handed over by the process that started
    this one. Raises ``OSError`` when ``fd`` is not a listening TCP socket."""
    sock = socket.socket(fileno=fd)
    try:
        if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET,
                                                                   socket.AF_INET6):
            raise OSError(f"descriptor {fd} is not a TCP socket")
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise OSError(f"descriptor {fd} is not listening")
    except OSError:
        sock.detach()
        raise
    return sock


def listener_inodes(port: int) -> set[int]:
    """The inodes of the TCP sockets (IPv4 and IPv6) that listen on ``port``, any address."""
    inodes: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            local_port = fields[1].rpartition(":")[2]
            try:
                if int(local_port, 16) == port:
                    inodes.add(int(fields[9]))
            except ValueError:
                continue
    return inodes


def group_socket_inodes(pgid: int) -> set[int]:
    """The inodes of the sockets open in any process of process group ``pgid``."""
    inodes: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
            # The command name (field 2) may hold spaces and parentheses: split after it.
            if int(stat.rpartition(")")[2].split()[2]) != pgid:
                continue
            fd_dir = f"/proc/{entry}/fd"
            for fd in os.listdir(fd_dir):
                target = os.readlink(os.path.join(fd_dir, fd))
                if target.startswith("socket:[") and target.endswith("]"):
                    inodes.add(int(target[8:-1]))
        except (OSError, ValueError, IndexError):
            continue
    return inodes


def owns_port(pgid: int, port: int) -> bool:
    """Whether something listens on ``port`` and every socket that does is held by a process
    of group ``pgid`` (the group a server of ours runs in). False while nothing listens yet,
    and whenever another process holds a listener on that port."""
    listeners = listener_inodes(port)
    return bool(listeners) and listeners <= group_socket_inodes(pgid)


async def until_owned(process: ManagedProcess, port: int, poll: float = 0.25) -> bool:
    """Wait until ``process``'s group holds the listener on ``port`` (True) or the process
    has exited (False). The caller's cancel scope bounds it; the ``/proc`` reads run in a
    worker thread (listed in ``process.threads`` while one runs on after a cancel)."""
    reads = trio.CapacityLimiter(1)
    while process.returncode is None:
        if await run_blocking(partial(owns_port, process.pgid, port), abandon_on_cancel=True,
                              limiter=reads, description=f"who holds port {port}",
                              tracker=process.threads):
            return True
        await trio.sleep(poll)
    return False

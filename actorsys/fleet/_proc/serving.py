"""What every fleet that starts or reaches a server shares: its random key, a free port, the
``--host`` of its command line, and the one wait until it is healthy.

:func:`wait_healthy` is how a local fleet waits for its engines and router, a Ray engine actor
for its server (in a trio run of its own) and an external server for the server it launched or
attached to. Its rules are the same for all three:

- a **deadline** (trio's clock) bounds the whole wait: the ownership proof, then the polls;
- a server that refuses our key (**401 or 403**, :class:`EngineUnauthorizedError`) is not
  waited on: that raises at once, since a key does not become right by asking again;
- a **process that died** (``exited()`` gives its status) ends the wait at once instead of at
  the deadline;
- a server that binds its own port is first **proven to hold it** (``owned``, see ``_port``):
  nothing, ``/health`` included, goes to a port another process took.
"""

from __future__ import annotations

import logging
import secrets
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import httpx
import trio

from actorsys import _http
from actorsys._http import Backoff
from actorsys.fleet.on_all import EngineUnauthorizedError, EngineUnhealthyError

log = logging.getLogger("actorsys.fleet")

T = TypeVar("T")
HEALTH_POLL_INTERVAL = 0.25
HEALTH_REQUEST_TIMEOUT = 5.0


def new_api_key() -> str:
    """A random key for the engines of one fleet."""
    return secrets.token_urlsafe(32)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now. Another process may take it
    before it is used: a server started on it must be proven to hold it
    (:func:`actorsys.fleet._proc.port.owns_port`) before anything is sent there."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def on_host(argv: Sequence[str], host: str) -> list[str]:
    """``argv`` with the value of every ``--host`` replaced by ``host`` (added if it has
    none): a second ``--host`` appended after the first would leave which one wins to the
    server's parser."""
    argv = [f"--host={host}" if arg.startswith("--host=") else arg for arg in argv]
    places = [i + 1 for i, arg in enumerate(argv[:-1]) if arg == "--host"]
    for place in places:
        argv[place] = host
    found = places or any(arg.startswith("--host=") for arg in argv)
    return argv if found else [*argv, "--host", host]


def get_health(url: str, name: str) -> Callable[[], Awaitable[None]]:
    """A check for :func:`wait_healthy`: ``GET {url}/health`` answers 200 (no key needed).
    A 401 or 403 raises :class:`EngineUnauthorizedError`; anything else, or no answer,
    :class:`EngineUnhealthyError` (not yet)."""

    async def check() -> None:
        try:
            async with _http.client(timeout=HEALTH_REQUEST_TIMEOUT) as client:
                response = await client.get(f"{url}/health")
        except httpx.HTTPError as exc:
            raise EngineUnhealthyError(name, f"GET {url}/health: {exc!r}") from exc
        _http.check_authorized(name, "GET", f"{url}/health", response, None)
        if response.status_code != 200:
            raise EngineUnhealthyError(name, f"GET {url}/health answered {response.status_code}")

    return check


def _alive() -> int | None:
    return None


async def wait_healthy(
    check: Callable[[], Awaitable[T]],
    *,
    deadline: float,
    fail: Callable[[int | None], Awaitable[BaseException]],
    exited: Callable[[], int | None] = _alive,
    owned: Callable[[], Awaitable[bool]] | None = None,
    interval: float = HEALTH_POLL_INTERVAL,
    max_interval: float = HEALTH_POLL_INTERVAL,
) -> T:
    """``await check()`` until it returns, and return its value.

    ``check`` raises :class:`EngineUnhealthyError` while the server is not up yet (polled
    again after ``interval`` seconds, doubling up to ``max_interval``) and
    :class:`EngineUnauthorizedError` when it refuses our key (raised at once). ``exited()``:
    the exit status of the server's process, None while it runs (an attached server has
    none). ``owned()``: awaited first; False when the process exited before it held its
    port. The error raised otherwise is ``await fail(status)``: ``status`` the process's
    exit status, or None when ``deadline`` (trio's clock) passed first.
    """
    status: int | None = None
    with trio.move_on_at(deadline):
        if owned is not None and not await owned():
            status = exited()
        else:
            async for _ in Backoff(interval, max_interval):
                if (status := exited()) is not None:
                    break
                try:
                    return await check()
                except EngineUnauthorizedError:
                    raise
                except EngineUnhealthyError as exc:
                    log.debug("server not ready: %s", exc)
    raise await fail(status)

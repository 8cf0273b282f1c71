"""The one home of actorsys's HTTP clients: how a client is built (the one TLS context of
a context built once: :func:`ssl_context`), how the key is sent (a bearer token), what a 401 or 403 means (our
key is wrong or missing: :class:`~actorsys.EngineUnauthorizedError`, never retried), and the
one backoff between attempts.

Every client of an engine, a router or the fleet's door is built by :func:`client`; the one
client that runs where there is no event loop (the reward server's, in a scoring worker
process) by :func:`sync_client`. Every retry loop waits through :class:`Backoff`. Nothing here
blocks but the awaits; they run under trio or asyncio (through anyio) and the caller's cancel
scope bounds them.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Mapping

import anyio
import httpx

from actorsys._errors import EngineUnauthorizedError

RETRY_INITIAL_DELAY = 0.1
RETRY_MAX_DELAY = 2.0
UNAUTHORIZED = frozenset({401, 403})



@functools.cache
def ssl_context() -> ssl.SSLContext:
    """The one TLS context every HTTP client shares. Building a context loads the CA bundle,
    about 50 ms of CPU: a client made per request would pay that for every request, and a pin
    of four engines makes a dozen."""
    return ssl.create_default_context()


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The header that carries ``api_key`` (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def client(
    *,
    base_url: str = "",
    api_key: str | None = None,
    timeout: float | None = 30.0,
    transport: httpx.AsyncBaseTransport | None = None,
    headers: Mapping[str, str] | None = None,
    limits: httpx.Limits | None = None,
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` that sends ``api_key`` as a bearer token and verifies TLS with
    the one context of :func:`ssl_context`. ``transport`` replaces the network (tests, the
    door's in-process upstream). The caller closes it (``async with``, or ``aclose``)."""
    return httpx.AsyncClient(
        base_url=base_url,
        headers={**auth_headers(api_key), **(headers or {})},
        timeout=timeout,
        transport=transport,
        verify=ssl_context(),
        limits=limits or httpx.Limits(),
    )


def sync_client(
    *,
    api_key: str | None = None,
    timeout: float | httpx.Timeout | None = 30.0,
    transport: httpx.BaseTransport | None = None,
) -> httpx.Client:
    """An ``httpx.Client`` built as :func:`client` builds the async one, for code that runs
    with no event loop (a scoring worker process). Its calls block the calling thread, bounded
    by ``timeout`` per operation. The caller closes it (``with``)."""
    return httpx.Client(
        headers=auth_headers(api_key), timeout=timeout, transport=transport, verify=ssl_context()
    )


def unauthorized(
    who: str, method: str, url: str, response: httpx.Response, api_key: str | None
) -> EngineUnauthorizedError:
    """The error for a 401 or 403 answer from ``who`` to ``method url``."""
    key = "a wrong API key" if api_key else "no API key"
    return EngineUnauthorizedError(
        who,
        f"{method} {url} answered HTTP {response.status_code} ({response.text[:200]}): "
        f"we sent {key}; pass the server's key (api_key=, --engine-api-key, $ACTORSYS_API_KEY)",
    )


def check_authorized(
    who: str, method: str, url: str, response: httpx.Response, api_key: str | None
) -> httpx.Response:
    """``response``, unless it is a 401 or 403: then :func:`unauthorized`'s error."""
    if response.status_code in UNAUTHORIZED:
        raise unauthorized(who, method, url, response, api_key)
    return response


class Backoff:
    """The attempts of a retry loop: ``async for attempt in Backoff(): ...`` runs its body at
    once, then after waits that double from ``first`` up to ``most`` seconds; ``delay`` is
    the wait before the next attempt. It never ends by itself: the loop returns or raises
    on success or a final failure, and the caller's cancel scope bounds the rest (a wait is
    a checkpoint, cancelled at once)."""

    def __init__(self, first: float = RETRY_INITIAL_DELAY, most: float = RETRY_MAX_DELAY) -> None:
        self.first = first
        self.most = most
        self.delay = first
        self.attempt = 0

    def __aiter__(self) -> Backoff:
        return self

    async def __anext__(self) -> int:
        if self.attempt > 0:
            await anyio.sleep(self.delay)
            self.delay = min(self.delay * 2, self.most)
        self.attempt += 1
        return self.attempt

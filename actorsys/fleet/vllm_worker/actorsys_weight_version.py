"""An ASGI middleware that answers a request naming a weight version only from those weights.

The request gate of an evaluation (``actorsys.evals._door``) sends the pinned version in
:data:`VERSION_HEADER` with every request it forwards. vLLM's answers carry no version, so
without this an answer from other weights would pass the gate unseen. One implementation for
both servers actorsys starts: the embedded engine wraps its app in it (the served version read
from its model host), and vLLM loads it into its own process with ``--middleware
actorsys_weight_version.WeightVersionMiddleware`` (this directory on ``PYTHONPATH``), where it
reads the version as vLLM's ``GET /weight_info`` does (``app.state.engine_client``).

A request that carries the header is checked twice: before it reaches the server (another
version: refused at once, its body unread) and once its answer is complete (the version
changed while it was generated: the answer is withheld and refused). Either refusal is HTTP
:data:`REFUSED_STATUS` (409) with ``{"error": {"type": MISMATCH, "requested_version",
"served_version", "message"}}``, which the gate raises as stale weights (``pin_violation``).
A version that cannot be read is a 503. Both servers change a version only once the new
weights are in and no request is generating (the embedded engine's lock, vLLM's ``/pause``
in the pin), so an answer that spans a swap is seen by the second check. The answer of a
checked request is held until it is complete (the gate forwards whole answers; a streamed
one arrives at once). Requests without the header pass as they are. It imports nothing
beyond the standard library, since vLLM's venv has none of actorsys' dependencies.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

VERSION_HEADER = "x-actorsys-weight-version"
"""The request header that names the weight version an answer must come from."""
MISMATCH = "weight_version_mismatch"
"""The ``error.type`` of a refusal for another version."""
REFUSED_STATUS = 409
OPEN_PATHS = frozenset({"/health"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]
VersionReader = Callable[[Scope], Awaitable[str | None]]


async def vllm_version(scope: Scope) -> str | None:
    """The version vLLM serves, as its ``GET /weight_info`` reads it; None where it cannot."""
    try:
        client = scope["app"].state.engine_client
        return str(await client.get_weight_version())
    except Exception:  # an app without an engine client: the request is refused (503)
        return None


def requested_version(scope: Scope) -> str | None:
    """The version a request names in :data:`VERSION_HEADER`, or None."""
    wanted = VERSION_HEADER.encode()
    for name, value in scope.get("headers") or ():
        if name.lower() == wanted:
            return str(value.decode("latin-1"))
    return None


def refused_versions(body: bytes) -> tuple[str, str] | None:
    """The (requested, served) versions of a refusal of this middleware's, or None for any
    other body."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    if not isinstance(error, dict) or error.get("type") != MISMATCH:
        return None
    return str(error.get("requested_version")), str(error.get("served_version"))


class WeightVersionMiddleware:
    """Wraps ``app``: a request that names a version in :data:`VERSION_HEADER` is answered
    only while ``served_version`` reads that version, before and after it is served (409
    otherwise, 503 where the version cannot be read). ``served_version`` defaults to vLLM's
    (:func:`vllm_version`)."""

    def __init__(self, app: App, served_version: VersionReader | None = None) -> None:
        self.app = app
        self._served_version = served_version or vllm_version

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        wanted = requested_version(scope) if scope["type"] == "http" else None
        if wanted is None or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if not await self._serves(scope, wanted, send):
            return
        held: list[Message] = []

        async def hold(message: Message) -> None:
            held.append(message)

        await self.app(scope, receive, hold)
        if not await self._serves(scope, wanted, send):
            return
        for message in held:
            await send(message)

    async def _serves(self, scope: Scope, wanted: str, send: Send) -> bool:
        """Whether the served version is ``wanted``; if not, the refusal is sent."""
        served = await self._served_version(scope)
        if served == wanted:
            return True
        if served is None:
            await _answer(send, 503, {"error": {"message": "the served weight version cannot "
                                                           "be read", "type": "unavailable"}})
            return False
        message = (f"this server serves weight version {served!r}; the request asks for "
                   f"{wanted!r} ({VERSION_HEADER})")
        await _answer(send, REFUSED_STATUS, {"error": {
            "message": message, "type": MISMATCH,
            "requested_version": wanted, "served_version": served,
        }})
        return False


async def _answer(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            # The body may not have been read: the connection cannot be kept alive.
            (b"connection", b"close"),
        ],
    })
    await send({"type": "http.response.body", "body": body})

"""An ASGI middleware that answers every route but ``/health`` only with the server's key.

One implementation for both servers actorsys starts: the embedded engine wraps its app in it,
and vLLM loads it into its own process with ``--middleware actorsys_api_key.ApiKeyMiddleware``
(this directory on ``PYTHONPATH``), where it reads the key from ``VLLM_API_KEY``. vLLM's own
``--api-key`` guards only the paths under ``/v1`` (and ``/v2``, ``/inference``, ``/cohere``):
the dev-mode routes that swap and label the weights (``/collective_rpc``, ``/pause``,
``/resume``, ``/update_weight_version``, ``/weight_info``, ``/sleep``...) stay open to anyone
who can connect. This one guards them all. It imports nothing beyond the standard library,
since vLLM's venv has none of actorsys' dependencies.

The key is compared in constant time (the SHA-256 digests of the sent and the expected key,
so not even its length leaks); a request without it is answered 401 before its body is read.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

KEY_ENV = "VLLM_API_KEY"
OPEN_PATHS = frozenset({"/health"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


def bearer_matches(authorization: str | None, expected_digest: bytes) -> bool:
    """Whether the ``Authorization`` header value is ``Bearer <key>`` for the key whose
    SHA-256 digest is ``expected_digest``; compared in constant time."""
    scheme, _, token = (authorization or "").partition(" ")
    sent = _digest(token.strip()) if scheme.lower() == "bearer" else b""
    return hmac.compare_digest(sent, expected_digest)


class ApiKeyMiddleware:
    """Wraps ``app``: HTTP requests to any path but ``/health`` need ``Authorization: Bearer
    KEY`` (401 otherwise). ``key`` defaults to the environment's ``VLLM_API_KEY``; with none
    it refuses to start (a server meant to be guarded must never come up open)."""

    def __init__(self, app: App, key: str | None = None) -> None:
        key = key if key is not None else os.environ.get(KEY_ENV)
        if not key:
            raise RuntimeError(f"ApiKeyMiddleware: no key given and {KEY_ENV} is not set")
        self.app = app
        self._digest = _digest(key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        authorization = None
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                authorization = value.decode("latin-1")
                break
        if bearer_matches(authorization, self._digest):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps(
            {"error": {"message": "unauthorized: send the server's key as "
                                  "'Authorization: Bearer KEY'"}}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                    # The body was never read, so the server cannot keep this connection
                    # alive: say so, or a client reusing it meets a bare disconnect.
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

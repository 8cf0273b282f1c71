"""RequestGate: the only door between a harness running in a thread and the pinned fleet.

lm-evaluation-harness sends its requests from a worker thread that cannot be interrupted. When
its evaluation is cut (``eval_timeout``, close) the thread is abandoned and runs on, retrying,
while the supervisor re-pins the fleet to the next step: requests it sent straight to the
engines would then be answered with the next step's weights, or load engines that now serve
another evaluation. So the harness talks only to this gate, a loopback HTTP/1.1 proxy that
lives inside the evaluation's cancel scope: cutting the evaluation closes the gate (its
listener and every forwarded request's connection) before the fleet goes back to the pool,
and from then on nothing the abandoned thread sends can reach an engine. Its URL holds a
random token, so a later gate that the OS happens to give the same port refuses it too.

The gate spreads requests round-robin over its upstreams (the router, or the engines), and
holds every answer that reports a weight version to the pinned one: a stale answer is refused
(502) and fails the evaluation as ``pin_violation``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import h11
import httpx
import trio

from actorsys.fleet._tls import ssl_context
from actorsys.fleet.completions import CompletionError, StaleWeightsError

VERSION_HEADER = "x-actorsys-weight-version"
HOP_HEADERS = frozenset({"host", "connection", "keep-alive", "content-length", "transfer-encoding"})
MAX_BODY = 16 * 1024 * 1024
"""The largest request body forwarded (lm-eval's batches of prompts are far smaller); a larger
one is refused (413) before it is read."""
MAX_HEAD = 64 * 1024
MAX_CONNECTIONS = 64
"""Open connections at once (lm-eval opens ``num_concurrent``); one more is answered 503 and
closed at once."""


@dataclass(frozen=True)
class GateStatistics:
    """``forwarded``: requests sent upstream; ``refused``: requests with a wrong token or path,
    too large a body, or past the connection limit; ``upstream_errors``: upstreams that failed
    to answer or answered 5xx."""

    forwarded: int
    refused: int
    upstream_errors: int


class RequestGate:
    """A proxy on 127.0.0.1 in front of ``upstreams``, serving while ``serve`` runs.

    Run it with ``url = await nursery.start(gate.serve)``; clients send to ``url`` + the
    upstream path (``/v1/completions``); ``transport`` replaces the upstream connections.
    Cancelling ``serve`` closes the listener and every open connection, upstream ones
    included. ``failure`` is set (and the scope given to ``cancel_on_failure`` cancelled) when
    an upstream answered with weights other than ``expected_version``. ``api_key``: the
    upstreams' key, sent on every forwarded request in place of whatever the client sent (the
    client proves itself with the URL's token; the engines' key never reaches it).
    """

    def __init__(
        self,
        upstreams: Sequence[str],
        *,
        expected_version: str | None,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not upstreams:
            raise ValueError("RequestGate(upstreams): at least one upstream URL is required")
        self.upstreams = [url.rstrip("/") for url in upstreams]
        self.expected_version = expected_version
        self._api_key = api_key
        self._transport = transport
        self.failure: CompletionError | None = None
        self._cancel_on_failure: trio.CancelScope | None = None
        self._next = itertools.cycle(range(len(self.upstreams)))
        self._token = secrets.token_urlsafe(16)
        self._forwarded = self._refused = self._upstream_errors = 0
        self._connections = 0

    def statistics(self) -> GateStatistics:
        return GateStatistics(self._forwarded, self._refused, self._upstream_errors)

    def cancel_on_failure(self, scope: trio.CancelScope) -> None:
        """Cancel ``scope`` when an answer from stale weights is seen."""
        self._cancel_on_failure = scope

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on a free port of 127.0.0.1 (only this host's harness talks to it), report
        the gate's URL, serve until cancelled."""
        async with (
            httpx.AsyncClient(timeout=None, verify=ssl_context(), transport=self._transport) as client,
            trio.open_nursery() as nursery,
        ):
            listeners = await nursery.start(
                partial(trio.serve_tcp, host="127.0.0.1"),
                lambda stream: self._connection(stream, client),
                0,
            )
            port = listeners[0].socket.getsockname()[1]
            task_status.started(f"http://127.0.0.1:{port}/{self._token}")

    async def _connection(self, stream: trio.SocketStream, client: httpx.AsyncClient) -> None:
        async with stream:
            if self._connections >= MAX_CONNECTIONS:
                self._refused += 1
                await _turn_away(stream)
                return
            self._connections += 1
            try:
                await self._serve_connection(stream, client)
            finally:
                self._connections -= 1

    async def _serve_connection(self, stream: trio.SocketStream, client: httpx.AsyncClient) -> None:
        """Answer the requests of one connection in turn. A request is checked on its head
        (token, declared size) before its body is read; a refused one closes the connection."""
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        while True:
            try:
                request = await _read_head(connection, stream)
                if request is None:
                    return
                refusal = self._refusal(request)
                body = b"" if refusal is not None else await _read_body(connection, stream)
            except (h11.RemoteProtocolError, trio.BrokenResourceError):
                return
            if refusal is not None:
                self._refused += 1
                status, content = refusal
            else:
                status, content = await self._answer(client, *_parts(request), body)
            reply = h11.Response(
                status_code=status,
                headers=[("content-type", "application/json"), ("content-length", str(len(content)))],
            )
            try:
                # One write for the whole answer: each write releases the GIL, and taking it
                # back waits for the client's thread when that is busy (the OpenAI SDK in an
                # eval fn's asyncio thread), about a millisecond a write.
                await stream.send_all(
                    b"".join(
                        connection.send(event)
                        for event in (reply, h11.Data(data=content), h11.EndOfMessage())
                    )
                )
            except (h11.LocalProtocolError, trio.BrokenResourceError):
                return
            if connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
                return
            connection.start_next_cycle()

    def _refusal(self, request: h11.Request) -> tuple[int, bytes] | None:
        """Why ``request`` is refused on its head alone, or None."""
        target = request.target.decode("latin-1")
        if not target.startswith(f"/{self._token}/") or self.failure is not None:
            return 404, _error("no such gate (the evaluation it served has ended)")
        for name, value in request.headers:
            if name == b"content-length" and int(value) > MAX_BODY:
                return 413, _error(f"request body over {MAX_BODY} bytes")
        return None

    async def _answer(
        self,
        client: httpx.AsyncClient,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes,
    ) -> tuple[int, bytes]:
        prefix = f"/{self._token}/"
        upstream = self.upstreams[next(self._next)]
        url = upstream + target[len(prefix) - 1 :]
        if self.expected_version is not None:
            headers[VERSION_HEADER] = self.expected_version
        if self._api_key is not None:
            headers["authorization"] = f"Bearer {self._api_key}"
        self._forwarded += 1
        try:
            response = await client.request(method, url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            self._upstream_errors += 1
            return 502, _error(f"{upstream} did not answer: {exc!r}")
        if response.status_code >= 500:
            self._upstream_errors += 1
        stale = self._stale_version(response)
        if stale is not None:
            self.failure = StaleWeightsError(upstream, self._forwarded - 1, *stale)
            if self._cancel_on_failure is not None:
                self._cancel_on_failure.cancel()
            return 502, _error(str(self.failure))
        return response.status_code, response.content

    def _stale_version(self, response: httpx.Response) -> tuple[str, str] | None:
        if self.expected_version is None or response.status_code != 200:
            return None
        try:
            metadata = response.json().get("metadata")
        except (ValueError, AttributeError):
            return None
        version = metadata.get("weight_version") if isinstance(metadata, dict) else None
        if version is None or str(version) == self.expected_version:
            return None
        return self.expected_version, str(version)


async def _read_head(connection: h11.Connection, stream: trio.SocketStream) -> h11.Request | None:
    """The next request's head; None when the client closed."""
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await stream.receive_some(65536))
        elif isinstance(event, h11.Request):
            return event
        else:
            return None


async def _read_body(connection: h11.Connection, stream: trio.SocketStream) -> bytes:
    """The body of the request whose head was read; raises ``RemoteProtocolError`` past
    :data:`MAX_BODY` (a chunked body declares no size)."""
    body = bytearray()
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await stream.receive_some(65536))
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY:
                raise h11.RemoteProtocolError("request body too large")
        elif isinstance(event, h11.EndOfMessage):
            return bytes(body)
        else:
            raise h11.RemoteProtocolError(f"unexpected {event!r} in a request body")


async def _turn_away(stream: trio.SocketStream) -> None:
    """Answer 503 without reading the request, then close. What the client sent meanwhile is
    drained for a moment (at most 64 KiB, one second): closing on unread data would reset the
    connection and lose the answer."""
    with contextlib.suppress(trio.BrokenResourceError), trio.move_on_after(1.0):
        await stream.send_all(_BUSY)
        await stream.send_eof()
        drained = 0
        while drained < MAX_HEAD and (chunk := await stream.receive_some(MAX_HEAD)):
            drained += len(chunk)


def _parts(request: h11.Request) -> tuple[str, str, dict[str, str]]:
    """Method, target and end-to-end headers of ``request``."""
    headers = {
        name.decode(): value.decode("latin-1")
        for name, value in request.headers
        if name.decode() not in HOP_HEADERS
    }
    return request.method.decode(), request.target.decode(), headers


def _error(message: str) -> bytes:
    return json.dumps({"error": {"message": message}}).encode()


_BUSY_BODY = _error(f"over {MAX_CONNECTIONS} connections open")
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    + f"content-length: {len(_BUSY_BODY)}\r\nconnection: close\r\n\r\n".encode()
    + _BUSY_BODY
)

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

It forwards with the engines' key, so it is a door another local user must not open or block:

- Only :data:`ROUTES` pass (the completions, chat completions and models routes an
  evaluation needs, and ``/health``), matched exactly, so no ``..`` or percent-encoded form reaches another
  route of the engines (the weight-update ones). Only :data:`FORWARDED_HEADERS` are passed on
  (no hop-by-hop header, no ``Proxy-Authorization``); the key is the gate's own.
- The token is compared in constant time (``hmac.compare_digest``). A connection counts
  against :data:`MAX_CONNECTIONS` only once its first request showed the token: before that
  it must send its head within :data:`HEAD_TIMEOUT`, and at most :data:`MAX_PENDING` such
  connections are kept (a new one closes the oldest), so idle sockets without the token
  cannot fill the gate. A kept-alive connection idle for :data:`IDLE_TIMEOUT` is closed.
- Whatever a client sends wrong (a malformed head, a header value that is not ASCII, a body
  that stops) is answered 4xx on that connection; nothing a client sends ends the gate.
"""

from __future__ import annotations

import contextlib
import hmac
import http
import itertools
import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import h11
import httpx
import trio

from actorsys._tls import ssl_context
from actorsys.fleet.completions import CompletionError, StaleWeightsError

log = logging.getLogger("actorsys.evals")

VERSION_HEADER = "x-actorsys-weight-version"
ROUTES = frozenset({
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/models"),
    ("GET", "/health"),
})
"""The (method, path) pairs the gate forwards; the path after the token must be exactly one
of these (no query, no other spelling). ``/health`` changes nothing and needs no key."""
FORWARDED_HEADERS = frozenset({"content-type", "accept", "user-agent", "x-request-id",
                               VERSION_HEADER})
"""The client headers passed on (the client's ``authorization`` too, when the gate has no key
of its own; the version stamp is the gate's own when it pins one); every other header,
hop-by-hop ones included, stays at the gate."""
HEAD_TIMEOUT = 10.0
"""Seconds a new connection has to send its first request's head whole."""
IDLE_TIMEOUT = 60.0
"""Seconds a connection may wait between requests, or within a body, before it is closed."""
MAX_PENDING = 64
"""Connections kept at once that have not shown the token yet; a new one closes the oldest."""
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
        self._pending: OrderedDict[int, trio.CancelScope] = OrderedDict()
        self._pending_ids = itertools.count()

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
            try:
                await self._admit(stream, client)
            except Exception:
                # Nothing a client sends may end the gate: a failure of ours on one
                # connection closes that connection only.
                self._refused += 1
                log.exception("the request gate closed a connection on an unexpected error")

    async def _admit(self, stream: trio.SocketStream, client: httpx.AsyncClient) -> None:
        """Read the first head (bounded, before the connection counts), check its token, then
        serve the connection if it is within :data:`MAX_CONNECTIONS`."""
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        key = next(self._pending_ids)
        with trio.CancelScope() as pending:
            self._pending[key] = pending
            while len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)[1].cancel()
            try:
                pending.deadline = trio.current_time() + HEAD_TIMEOUT
                request = await _read_head(connection, stream)
            except h11.RemoteProtocolError as exc:
                await self._refuse_raw(stream, exc.error_status_hint, f"malformed request: {exc}")
                return
            except trio.BrokenResourceError:
                return
            finally:
                self._pending.pop(key, None)
        if pending.cancelled_caught:
            self._refused += 1  # no head in time, or pushed out by newer connections
            return
        if request is None:
            return
        if not self._token_ok(request):
            self._refused += 1
            await self._reply(connection, stream, 404, _error(
                "no such gate (the evaluation it served has ended)"))
            return
        if self._connections >= MAX_CONNECTIONS:
            self._refused += 1
            await _turn_away(stream)
            return
        self._connections += 1
        try:
            await self._serve_connection(stream, client, connection, request)
        finally:
            self._connections -= 1

    async def _serve_connection(
        self,
        stream: trio.SocketStream,
        client: httpx.AsyncClient,
        connection: h11.Connection,
        first: h11.Request,
    ) -> None:
        """Answer the requests of one connection in turn, ``first`` (already read) first. A
        request is checked on its head (token, route, headers, declared size) before its body
        is read; a refused one closes the connection."""
        request: h11.Request | None = first
        while True:
            try:
                with trio.move_on_after(IDLE_TIMEOUT) as idle:
                    if request is None:
                        request = await _read_head(connection, stream)
                        if request is None:
                            return
                    refusal = self._refusal(request)
                    body = b"" if refusal is not None else await _read_body(connection, stream)
            except h11.RemoteProtocolError as exc:
                self._refused += 1
                await self._reply(connection, stream, exc.error_status_hint,
                                  _error(f"malformed request: {exc}"))
                return
            except trio.BrokenResourceError:
                return
            if idle.cancelled_caught:
                if request is not None:  # it stopped within its body
                    self._refused += 1
                    await self._reply(connection, stream, 408, _error("request timed out"))
                return
            assert request is not None
            if refusal is not None:
                self._refused += 1
                status, content = refusal
            else:
                method, path, headers = self._parts(request)
                status, content = await self._answer(client, method, path, headers, body)
            request = None
            if not await self._reply(connection, stream, status, content):
                return
            if connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
                return
            connection.start_next_cycle()

    async def _reply(
        self, connection: h11.Connection, stream: trio.SocketStream, status: int, content: bytes
    ) -> bool:
        """Send one JSON answer; False when the connection cannot carry it (then it closes)."""
        reply = h11.Response(
            status_code=status,
            headers=[("content-type", "application/json"), ("content-length", str(len(content)))],
        )
        try:
            # One write for the whole answer: each write releases the GIL, and taking it back
            # waits for the client's thread when that is busy (the OpenAI SDK in an eval fn's
            # asyncio thread), about a millisecond a write.
            await stream.send_all(
                b"".join(
                    connection.send(event)
                    for event in (reply, h11.Data(data=content), h11.EndOfMessage())
                )
            )
        except (h11.LocalProtocolError, trio.BrokenResourceError):
            return False
        return True

    async def _refuse_raw(self, stream: trio.SocketStream, status: int, message: str) -> None:
        """Answer ``status`` and close, for a head h11 could not parse."""
        self._refused += 1
        body = _error(message[:200])
        phrase = http.HTTPStatus(status).phrase if status in http.HTTPStatus._value2member_map_ else ""
        head = (f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
        with contextlib.suppress(trio.BrokenResourceError), trio.move_on_after(1.0):
            await stream.send_all(head + body)

    def _token_ok(self, request: h11.Request) -> bool:
        """Whether the target starts with ``/TOKEN/`` (compared in constant time)."""
        parts = request.target.split(b"/", 2)
        if len(parts) < 3 or parts[0] != b"":
            return False
        return hmac.compare_digest(parts[1], self._token.encode())

    def _refusal(self, request: h11.Request) -> tuple[int, bytes] | None:
        """Why ``request`` is refused on its head alone, or None."""
        if not self._token_ok(request) or self.failure is not None:
            return 404, _error("no such gate (the evaluation it served has ended)")
        path = b"/" + request.target.split(b"/", 2)[2]
        method = request.method
        if (method.decode("latin-1"), path.decode("latin-1")) not in ROUTES:
            routes = ", ".join(f"{m} {p}" for m, p in sorted(ROUTES))
            known = any(path.decode("latin-1") == p for _, p in ROUTES)
            return (405 if known else 404), _error(f"the gate forwards only {routes}")
        for name, value in request.headers:
            if not value.isascii():
                return 400, _error(f"header {name.decode('latin-1')!r}: the value is not ASCII")
            if name == b"content-length" and (not value.isdigit() or int(value) > MAX_BODY):
                return 413, _error(f"request body over {MAX_BODY} bytes")
        return None

    def _parts(self, request: h11.Request) -> tuple[str, str, dict[str, str]]:
        """Method, path after the token (one of :data:`ROUTES`) and the headers passed on."""
        allowed = FORWARDED_HEADERS if self._api_key is not None else (
            FORWARDED_HEADERS | {"authorization"})
        headers = {
            name.decode("ascii"): value.decode("ascii")
            for name, value in request.headers
            if name.decode("ascii", "replace") in allowed
        }
        path = "/" + request.target.split(b"/", 2)[2].decode("ascii")
        return request.method.decode("ascii"), path, headers

    async def _answer(
        self,
        client: httpx.AsyncClient,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes,
    ) -> tuple[int, bytes]:
        upstream = self.upstreams[next(self._next)]
        url = upstream + target
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


def _error(message: str) -> bytes:
    return json.dumps({"error": {"message": message}}).encode()


_BUSY_BODY = _error(f"over {MAX_CONNECTIONS} connections open")
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    + f"content-length: {len(_BUSY_BODY)}\r\nconnection: close\r\n\r\n".encode()
    + _BUSY_BODY
)

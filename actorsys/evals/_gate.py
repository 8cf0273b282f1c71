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

import itertools
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import h11
import httpx
import trio

from actorsys.fleet._tls import ssl_context
from actorsys.fleet.completions import CompletionError, StaleWeightsError

VERSION_HEADER = "x-actorsys-weight-version"
HOP_HEADERS = frozenset({"host", "connection", "keep-alive", "content-length", "transfer-encoding"})
MAX_BODY = 64 * 1024 * 1024


@dataclass(frozen=True)
class GateStatistics:
    """``forwarded``: requests sent upstream; ``refused``: requests with a wrong token or path;
    ``upstream_errors``: upstreams that failed to answer or answered 5xx."""

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

    def statistics(self) -> GateStatistics:
        return GateStatistics(self._forwarded, self._refused, self._upstream_errors)

    def cancel_on_failure(self, scope: trio.CancelScope) -> None:
        """Cancel ``scope`` when an answer from stale weights is seen."""
        self._cancel_on_failure = scope

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on a free loopback port, report the gate's URL, serve until cancelled."""
        async with (
            httpx.AsyncClient(timeout=None, verify=ssl_context(), transport=self._transport) as client,
            trio.open_nursery() as nursery,
        ):
            listeners = await nursery.start(
                trio.serve_tcp, lambda stream: self._connection(stream, client), 0
            )
            port = listeners[0].socket.getsockname()[1]
            task_status.started(f"http://127.0.0.1:{port}/{self._token}")

    async def _connection(self, stream: trio.SocketStream, client: httpx.AsyncClient) -> None:
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_BODY)
        async with stream:
            while True:
                try:
                    request = await _read_request(connection, stream)
                except (h11.RemoteProtocolError, trio.BrokenResourceError):
                    return
                if request is None:
                    return
                status, content = await self._answer(client, *request)
                reply = h11.Response(
                    status_code=status,
                    headers=[("content-type", "application/json"), ("content-length", str(len(content)))],
                )
                try:
                    await stream.send_all(connection.send(reply))
                    await stream.send_all(connection.send(h11.Data(data=content)))
                    await stream.send_all(connection.send(h11.EndOfMessage()))
                except (h11.LocalProtocolError, trio.BrokenResourceError):
                    return
                if connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
                    return
                connection.start_next_cycle()

    async def _answer(
        self,
        client: httpx.AsyncClient,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes,
    ) -> tuple[int, bytes]:
        prefix = f"/{self._token}/"
        if not target.startswith(prefix) or self.failure is not None:
            self._refused += 1
            return 404, _error("no such gate (the evaluation it served has ended)")
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


async def _read_request(
    connection: h11.Connection, stream: trio.SocketStream
) -> tuple[str, str, dict[str, str], bytes] | None:
    """The next request's method, target, end-to-end headers and body; None when the client
    closed."""
    request: h11.Request | None = None
    body = bytearray()
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await stream.receive_some(65536))
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY:
                raise h11.RemoteProtocolError("request body too large")
        elif isinstance(event, h11.EndOfMessage):
            assert request is not None
            headers = {
                name.decode(): value.decode("latin-1")
                for name, value in request.headers
                if name.decode() not in HOP_HEADERS
            }
            return request.method.decode(), request.target.decode(), headers, bytes(body)
        elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None


def _error(message: str) -> bytes:
    return json.dumps({"error": {"message": message}}).encode()

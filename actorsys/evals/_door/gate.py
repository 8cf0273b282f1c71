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
holds answers to the pinned version in two ways; a stale answer is refused (502) and fails the
evaluation as ``pin_violation``:

- every request carries the pinned version in ``x-actorsys-weight-version``. The servers
  actorsys starts enforce it (the CPU engine, and vLLM through actorsys' middleware,
  :mod:`actorsys.fleet.vllm_worker.actorsys_weight_version`): a request for another version
  is refused with 409 ``weight_version_mismatch``, before it is generated or, where the
  version changed while it was, instead of its answer; the gate reads that refusal as stale
  weights;
- an answer that reports its version (``metadata.weight_version``: the CPU engine's) is
  compared with the pinned one.

Where neither holds (a vLLM server actorsys did not start, hence without the middleware; an
sglang server, which neither reads the header nor reports a version in its OpenAI answers),
the gate holds nothing per answer: what holds the version there is the pin (every engine read
back the version before the evaluation, and the fleet is leased to it), the probe awaited
before the point settles, and closing the gate before the fleet goes back to the pool.

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

What passes, judged on a request's head, is :mod:`actorsys.evals._door.routes`; how a request
is read and an answer written on the wire, :mod:`actorsys.evals._door.http_wire`.
"""

from __future__ import annotations

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

from actorsys import _http
from actorsys.evals._door.http_wire import (
    closing_answer,
    error_body,
    read_body,
    read_head,
    send_closing,
    send_json,
)
from actorsys.evals._door.routes import (
    GATE_ENDED,
    MAX_BODY,
    VERSION_HEADER,
    forwarded_parts,
    refusal,
    token_ok,
)
from actorsys.fleet.clients.completions import CompletionError, StaleWeightsError
from actorsys.fleet.vllm_worker.actorsys_weight_version import REFUSED_STATUS, refused_versions

log = logging.getLogger("actorsys.evals")

HEAD_TIMEOUT = 10.0
"""Seconds a new connection has to send its first request's head whole."""
IDLE_TIMEOUT = 60.0
"""Seconds a connection may wait between requests, or within a body, before it is closed."""
MAX_PENDING = 64
"""Connections kept at once that have not shown the token yet; a new one closes the oldest."""
MAX_HEAD = 64 * 1024
MAX_CONNECTIONS = 64
"""Open connections at once (lm-eval opens ``num_concurrent``); one more is answered 503 and
closed at once."""
_BUSY = closing_answer(503, error_body(f"over {MAX_CONNECTIONS} connections open"))


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
    ``priorities``: the ``priority`` written into every JSON body forwarded to an upstream (by
    its URL), in place of whatever the client sent, so a harness cannot queue an evaluation
    ahead of the trainer's requests.
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
        self.priorities: dict[str, int] = {}
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
            _http.client(timeout=None, transport=self._transport) as client,
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
                request = await read_head(connection, stream)
            except h11.RemoteProtocolError as exc:
                self._refused += 1
                answer = closing_answer(exc.error_status_hint,
                                        error_body(f"malformed request: {exc}"[:200]))
                await send_closing(stream, answer)
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
        if not token_ok(request, self._token):
            self._refused += 1
            await send_json(connection, stream, 404, error_body(GATE_ENDED))
            return
        if self._connections >= MAX_CONNECTIONS:
            self._refused += 1
            await send_closing(stream, _BUSY, drain=MAX_HEAD)
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
                        request = await read_head(connection, stream)
                        if request is None:
                            return
                    refused = refusal(request, self._token, ended=self.failure is not None)
                    body = b"" if refused is not None else await read_body(connection, stream, limit=MAX_BODY)
            except h11.RemoteProtocolError as exc:
                self._refused += 1
                await send_json(connection, stream, exc.error_status_hint,
                                error_body(f"malformed request: {exc}"))
                return
            except trio.BrokenResourceError:
                return
            if idle.cancelled_caught:
                if request is not None:  # it stopped within its body
                    self._refused += 1
                    await send_json(connection, stream, 408, error_body("request timed out"))
                return
            assert request is not None
            if refused is not None:
                self._refused += 1
                status, content = refused
            else:
                method, path, headers = forwarded_parts(
                    request, client_authorization=self._api_key is None)
                status, content = await self._answer(client, method, path, headers, body)
            request = None
            if not await send_json(connection, stream, status, content):
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
        upstream = self.upstreams[next(self._next)]
        url = upstream + target
        if self.expected_version is not None:
            headers[VERSION_HEADER] = self.expected_version
        if self._api_key is not None:
            headers.update((k.lower(), v) for k, v in _http.auth_headers(self._api_key).items())
        priority = self.priorities.get(upstream)
        if priority is not None and method == "POST":
            body = with_priority(body, priority)
        self._forwarded += 1
        try:
            response = await client.request(method, url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            self._upstream_errors += 1
            return 502, error_body(f"{upstream} did not answer: {exc!r}")
        if response.status_code >= 500:
            self._upstream_errors += 1
        stale = self._stale_version(response)
        if stale is not None:
            self.failure = StaleWeightsError(upstream, self._forwarded - 1, *stale)
            if self._cancel_on_failure is not None:
                self._cancel_on_failure.cancel()
            return 502, error_body(str(self.failure))
        return response.status_code, response.content

    def _stale_version(self, response: httpx.Response) -> tuple[str, str] | None:
        """(pinned, served) where ``response`` came from, or was refused by, other weights."""
        if self.expected_version is None:
            return None
        if response.status_code == REFUSED_STATUS:
            refused = refused_versions(response.content)
            return None if refused is None else (self.expected_version, refused[1])
        if response.status_code != 200:
            return None
        try:
            metadata = response.json().get("metadata")
        except (ValueError, AttributeError):
            return None
        version = metadata.get("weight_version") if isinstance(metadata, dict) else None
        if version is None or str(version) == self.expected_version:
            return None
        return self.expected_version, str(version)


def with_priority(body: bytes, priority: int) -> bytes:
    """``body`` with its ``priority`` set, where it is a JSON object (anything else goes as
    it is: the engine answers it)."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body
    if not isinstance(payload, dict):
        return body
    payload["priority"] = priority
    return json.dumps(payload).encode()

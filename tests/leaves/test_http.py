"""The one HTTP home (actorsys._http): the key as a bearer token, 401/403 as
EngineUnauthorizedError, the one backoff, and an engine's one client reusing its connection
to a real loopback server."""

from __future__ import annotations

import functools

import h11
import httpx
import pytest
import trio

from actorsys import EngineUnhealthyError, _http
from actorsys._errors import EngineUnauthorizedError
from actorsys.fleet import SGLangEngine
from actorsys.fleet.pin.pinning import _probe_router


async def test_the_backoff_runs_at_once_then_waits_doubling_up_to_its_most(autojump_clock: object) -> None:
    starts = []
    async for attempt in _http.Backoff(0.1, 0.5):
        starts.append(round(trio.current_time(), 3))
        if attempt == 6:
            break
    assert starts == [0.0, 0.1, 0.3, 0.7, 1.2, 1.7]


async def test_a_backoff_wait_is_cancelled_by_the_callers_scope(autojump_clock: object) -> None:
    attempts = 0
    with trio.move_on_after(1.0):
        async for _ in _http.Backoff(10.0, 10.0):
            attempts += 1
    assert attempts == 1 and trio.current_time() == pytest.approx(1.0)


async def test_a_client_sends_the_key_and_a_401_is_unauthorized() -> None:
    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(401, text="who are you")

    async with _http.client(api_key="k", transport=httpx.MockTransport(answer)) as client:
        response = await client.get("http://127.0.0.1:1/v1/models")
    assert seen == ["Bearer k"]
    with pytest.raises(EngineUnauthorizedError, match="a wrong API key"):
        _http.check_authorized("e", "GET", "/v1/models", response, "k")
    assert _http.check_authorized("e", "GET", "/", httpx.Response(200), None).status_code == 200


class CountingServer:
    """A loopback HTTP/1.1 server (h11) that answers every request with ``status`` and
    ``body`` and counts the connections it accepted."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body
        self.connections = 0
        self.requests = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        connection = h11.Connection(h11.SERVER)
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                if not data:
                    return
                connection.receive_data(data)
            elif isinstance(event, h11.EndOfMessage):
                self.requests += 1
                headers = [("content-type", "application/json"),
                           ("content-length", str(len(self.body)))]
                await stream.send_all(connection.send(h11.Response(status_code=self.status,
                                                                   headers=headers)) or b"")
                await stream.send_all(connection.send(h11.Data(data=self.body)) or b"")
                await stream.send_all(connection.send(h11.EndOfMessage()) or b"")
                connection.start_next_cycle()
            elif isinstance(event, h11.ConnectionClosed):
                return

    async def serve(self, nursery: trio.Nursery) -> str:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, host="127.0.0.1"), self.handle, 0)
        return f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"


@pytest.mark.timeout(60)
async def test_an_engine_reuses_one_connection_for_its_requests() -> None:
    server = CountingServer(200, b'{"weight_version": "7"}')
    async with trio.open_nursery() as nursery:
        engine = SGLangEngine(await server.serve(nursery), api_key="k")
        for _ in range(5):
            assert await engine.weight_version() == "7"
        assert (server.requests, server.connections) == (5, 1)
        await engine.aclose()
        assert await engine.weight_version() == "7"
        assert server.connections == 2
        await engine.aclose()
        nursery.cancel_scope.cancel()


def test_an_engine_builds_a_new_client_in_a_new_trio_run() -> None:
    engine = SGLangEngine("http://127.0.0.1:1")

    async def client() -> httpx.AsyncClient:
        return engine.client()

    first, again = trio.run(client), trio.run(client)
    assert first is not again


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("status", "error"), [(401, EngineUnauthorizedError),
                                               (503, EngineUnhealthyError)])
async def test_the_router_probe_tells_a_refused_key_from_an_unhealthy_router(
    status: int, error: type[Exception]
) -> None:
    server = CountingServer(status, b"{}")
    async with trio.open_nursery() as nursery:
        url = await server.serve(nursery)
        with pytest.raises(error) as raised:
            await _probe_router(url)
        nursery.cancel_scope.cancel()
    assert raised.type is error

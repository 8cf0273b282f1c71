"""The gate between a harness thread and the fleet: real loopback HTTP in front of a recorded
upstream."""

from __future__ import annotations

import hmac
import json

import httpx
import psutil
import pytest
import trio
import trio.testing

from actorsys.evals._door import gate as gate_module
from actorsys.evals._door.gate import MAX_BODY, VERSION_HEADER, RequestGate
from actorsys.fleet import StaleWeightsError
from tests.fleet.conftest import Recorder


def answer(version: str | None) -> httpx.Response:
    body = {"choices": [{"index": 0, "text": "x"}], "metadata": {"weight_version": version}}
    return httpx.Response(200, json=body)


async def test_gate_spreads_requests_round_robin_passes_headers_and_stamps_the_version(
    nursery: trio.Nursery,
) -> None:
    upstream = Recorder(lambda request: answer("7"))
    gate = RequestGate(["http://a", "http://b/"], expected_version="7", transport=upstream.transport)
    url = await nursery.start(gate.serve)
    async with httpx.AsyncClient(headers={"authorization": "Bearer key"}) as client:
        for index in range(4):
            response = await client.post(f"{url}/v1/completions", json={"prompt": str(index)})
            assert response.json()["choices"][0]["text"] == "x"
    assert [r.url.host for r in upstream.requests] == ["a", "b", "a", "b"]
    assert {r.url.path for r in upstream.requests} == {"/v1/completions"}
    assert [json.loads(r.content)["prompt"] for r in upstream.requests] == ["0", "1", "2", "3"]
    assert {r.headers[VERSION_HEADER] for r in upstream.requests} == {"7"}
    assert {r.headers["authorization"] for r in upstream.requests} == {"Bearer key"}
    assert gate.statistics().forwarded == 4


async def test_gate_refuses_requests_without_its_token(nursery: trio.Nursery) -> None:
    upstream = Recorder(lambda request: answer("7"))
    gate = RequestGate(["http://a"], expected_version="7", transport=upstream.transport)
    url = await nursery.start(gate.serve)
    origin = url.rsplit("/", 1)[0]
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{origin}/another-token/v1/completions", json={})
    assert response.status_code == 404
    assert upstream.requests == []
    assert gate.statistics().refused == 1


async def test_an_answer_from_stale_weights_is_refused_and_fails_the_evaluation(
    nursery: trio.Nursery,
) -> None:
    upstream = Recorder(lambda request: answer("6"))
    gate = RequestGate(["http://a"], expected_version="7", transport=upstream.transport)
    url = await nursery.start(gate.serve)
    evaluation = trio.CancelScope()
    gate.cancel_on_failure(evaluation)
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{url}/v1/completions", json={})
        assert response.status_code == 502
        assert isinstance(gate.failure, StaleWeightsError)
        assert gate.failure.reason == "pin_violation"
        assert evaluation.cancel_called
        again = await client.post(f"{url}/v1/completions", json={})
    assert again.status_code == 404
    assert len(upstream.requests) == 1


async def test_closing_the_gate_cuts_forwarded_requests_and_refuses_new_ones() -> None:
    arrived, upstream_cancelled = trio.Event(), trio.Event()

    async def hang(request: httpx.Request) -> httpx.Response:
        arrived.set()
        try:
            await trio.sleep_forever()
        finally:
            upstream_cancelled.set()
        raise AssertionError("unreachable")

    upstream = Recorder(hang)
    gate = RequestGate(["http://a"], expected_version=None, transport=upstream.transport)
    failures: list[Exception] = []

    async def send(client: httpx.AsyncClient, url: str) -> None:
        try:
            await client.post(f"{url}/v1/completions", json={})
        except httpx.HTTPError as exc:
            failures.append(exc)

    async with httpx.AsyncClient() as client, trio.open_nursery() as outer:
        async with trio.open_nursery() as gate_scope:
            url = await gate_scope.start(gate.serve)
            outer.start_soon(send, client, url)
            await arrived.wait()
            gate_scope.cancel_scope.cancel()
        assert upstream_cancelled.is_set()
        with pytest.raises(httpx.ConnectError):
            await client.post(f"{url}/v1/completions", json={})
    assert len(failures) == 1
    assert len(upstream.requests) == 1


async def raw_exchange(url: str, head: bytes) -> bytes:
    """Send ``head`` (and nothing more) to the gate; what it answers before closing."""
    port = int(url.split(":")[2].split("/")[0])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(head)
        received = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some(65536):
                received += chunk
    return received


async def test_gate_listens_on_loopback_only(nursery: trio.Nursery) -> None:
    gate = RequestGate(["http://a"], expected_version=None)
    url = await nursery.start(gate.serve)
    port = int(url.split(":")[2].split("/")[0])
    listening = [c for c in psutil.Process().net_connections(kind="tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    assert [c.laddr.ip for c in listening] == ["127.0.0.1"]


async def test_a_wrong_token_is_refused_before_the_body_is_read(nursery: trio.Nursery) -> None:
    upstream = Recorder(lambda request: answer(None))
    gate = RequestGate(["http://a"], expected_version=None, transport=upstream.transport)
    url = await nursery.start(gate.serve)
    # A head announcing 60 MB that never come: answered at once, the body never awaited.
    head = b"POST /not-the-token/v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 60000000\r\n\r\n"
    reply = await raw_exchange(url, head)
    assert reply.startswith(b"HTTP/1.1 404")
    assert upstream.requests == [] and gate.statistics().refused == 1


async def test_a_body_over_the_limit_is_refused_on_its_declared_size(nursery: trio.Nursery) -> None:
    upstream = Recorder(lambda request: answer(None))
    gate = RequestGate(["http://a"], expected_version=None, transport=upstream.transport)
    url = await nursery.start(gate.serve)
    path = url.split("/", 3)[3]
    head = (f"POST /{path}/v1/completions HTTP/1.1\r\nhost: x\r\n"
            f"content-length: {MAX_BODY + 1}\r\n\r\n").encode()
    reply = await raw_exchange(url, head)
    assert reply.startswith(b"HTTP/1.1 413")
    assert upstream.requests == []


async def test_connections_past_the_limit_are_answered_503_and_closed(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gate_module, "MAX_CONNECTIONS", 2)
    upstream = Recorder(lambda request: answer(None))
    gate = RequestGate(["http://a"], expected_version=None, transport=upstream.transport)
    url = await nursery.start(gate.serve)
    path = url.split("/", 3)[3]
    kept = f"GET /{path}/v1/models HTTP/1.1\r\nhost: x\r\n\r\n".encode()
    idle = [await kept_alive(url, kept) for _ in range(2)]  # token holders, kept open
    valid = f"GET /{path}/v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    assert (await raw_exchange(url, valid.encode())).startswith(b"HTTP/1.1 503")
    await idle[0].aclose()
    await trio.testing.wait_all_tasks_blocked()
    assert (await raw_exchange(url, valid.encode())).startswith(b"HTTP/1.1 200")
    await idle[1].aclose()
    assert [r.url.path for r in upstream.requests] == ["/v1/models"] * 3


async def kept_alive(url: str, head: bytes) -> trio.SocketStream:
    """A connection that sent ``head`` (a kept-alive request) and got its answer."""
    port = int(url.split(":")[2].split("/")[0])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(head)
    received = b""
    with trio.fail_after(10):
        while not received.endswith(b"}"):
            received += await stream.receive_some(65536)
    assert received.startswith(b"HTTP/1.1 200")
    return stream


async def test_64_idle_sockets_without_the_token_do_not_block_the_harness(
    nursery: trio.Nursery,
) -> None:
    upstream = Recorder(lambda request: answer(None))
    gate = RequestGate(["http://a"], expected_version=None, transport=upstream.transport)
    url = await nursery.start(gate.serve)
    port = int(url.split(":")[2].split("/")[0])
    idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(gate_module.MAX_PENDING + 64)]
    await trio.testing.wait_all_tasks_blocked()
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            for _ in range(3):
                response = await client.post(f"{url}/v1/completions", json={"prompt": "x"})
                assert response.status_code == 200
    finally:
        for stream in idle:
            await stream.aclose()
    assert len(upstream.requests) == 3


async def test_a_connection_that_sends_no_head_is_closed_at_the_header_deadline(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gate_module, "HEAD_TIMEOUT", 5.0)
    gate = RequestGate(["http://a"], expected_version=None)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(gate.serve)
        port = int(url.split(":")[2].split("/")[0])
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST /")  # a head that never ends
        start = trio.current_time()
        with trio.fail_after(60):
            assert await stream.receive_some(100) == b""  # closed by the gate
        assert 5.0 <= trio.current_time() - start < 6.0
        await stream.aclose()
        nursery.cancel_scope.cancel()
    assert gate.statistics().refused == 1


@pytest.mark.parametrize(
    ("request_line", "status"),
    [
        ("POST /{t}/update_weights_from_disk", 404),
        ("POST /{t}/../collective_rpc", 404),
        ("POST /{t}/v1/../pause", 404),
        ("POST /{t}/v1/%2e%2e/pause", 404),
        ("POST /{t}/v1/completions/../../pause", 404),
        ("POST /{t}/v1/completions?x=1", 404),
        ("GET /{t}/v1/completions", 405),
        ("DELETE /{t}/v1/models", 405),
        ("POST /{t}x/v1/completions", 404),
    ],
)
async def test_only_the_evaluation_routes_pass(
    nursery: trio.Nursery, request_line: str, status: int
) -> None:
    upstream = Recorder(lambda request: answer(None))
    gate = RequestGate(["http://a"], expected_version=None, api_key="k",
                       transport=upstream.transport)
    url = await nursery.start(gate.serve)
    token = url.split("/", 3)[3]
    head = (request_line.format(t=token) + " HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
    reply = await raw_exchange(url, head.encode())
    assert reply.startswith(f"HTTP/1.1 {status}".encode())
    assert upstream.requests == []


async def test_chat_completions_and_models_pass_with_only_end_to_end_headers(
    nursery: trio.Nursery,
) -> None:
    upstream = Recorder(lambda request: answer(None))
    gate = RequestGate(["http://a"], expected_version=None, api_key="fleet",
                       transport=upstream.transport)
    url = await nursery.start(gate.serve)
    hop = {"connection": "keep-alive, x-secret", "x-secret": "1", "te": "trailers",
           "upgrade": "h2c", "proxy-authorization": "Basic eA==", "user-agent": "lm-eval"}
    async with httpx.AsyncClient(headers=hop) as client:
        chat = await client.post(f"{url}/v1/chat/completions", json={"messages": []})
        models = await client.get(f"{url}/v1/models")
    assert chat.status_code == models.status_code == 200
    assert [r.url.path for r in upstream.requests] == ["/v1/chat/completions", "/v1/models"]
    for request in upstream.requests:
        names = set(request.headers.keys())
        assert not names & {"x-secret", "te", "upgrade", "proxy-authorization"}
        assert request.headers["authorization"] == "Bearer fleet"
        assert request.headers["user-agent"] == "lm-eval"


async def test_a_client_error_is_a_4xx_and_the_gate_serves_on(nursery: trio.Nursery) -> None:
    upstream = Recorder(lambda request: answer(None))
    gate = RequestGate(["http://a"], expected_version=None, api_key="k",
                       transport=upstream.transport)
    url = await nursery.start(gate.serve)
    token = url.split("/", 3)[3]
    non_ascii = (f"POST /{token}/v1/completions HTTP/1.1\r\nhost: x\r\n".encode()
                 + "user-agent: caf\u00e9\r\ncontent-length: 2\r\n\r\n{}".encode("latin-1"))
    assert (await raw_exchange(url, non_ascii)).startswith(b"HTTP/1.1 400")
    garbage = b"\x00\x01 not http at all\r\n\r\n"
    assert (await raw_exchange(url, garbage)).startswith(b"HTTP/1.1 4")
    async with httpx.AsyncClient() as client:
        assert (await client.post(f"{url}/v1/completions", json={})).status_code == 200


async def test_the_token_is_compared_in_constant_time(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[bytes] = []
    real = hmac.compare_digest

    def recorded(a: bytes, b: bytes) -> bool:
        compared.append(a)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recorded)
    upstream = Recorder(lambda request: answer(None))
    gate = RequestGate(["http://a"], expected_version=None, transport=upstream.transport)
    url = await nursery.start(gate.serve)
    origin = url.rsplit("/", 1)[0]
    async with httpx.AsyncClient() as client:
        assert (await client.post(f"{origin}/guess/v1/completions", json={})).status_code == 404
    assert b"guess" in compared

"""The gate between a harness thread and the fleet: real loopback HTTP in front of a recorded
upstream."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from actorsys.evals._gate import VERSION_HEADER, RequestGate
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

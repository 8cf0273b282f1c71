"""The request gate's version header is enforced by the servers actorsys starts: the CPU engine
(a real engine process, and in process where the test must swap the version mid-batch)
refuses a request naming another version than the one it serves with 409
``weight_version_mismatch``, and the gate reads that refusal, from a server whose answers
report no version (as vLLM's), as stale weights: ``pin_violation``."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from actorsys.evals._door.gate import RequestGate
from actorsys.fleet import StaleWeightsError
from actorsys.fleet.vllm_worker.actorsys_weight_version import (
    MISMATCH,
    VERSION_HEADER,
    WeightVersionMiddleware,
)
from tests.engine_process import engine_process
from tests.fleet.conftest import TinyModels
from tests.fleet.test_engine_batches import GatedHost
from tests.fleet.test_engine_hardening import CountingEngine, client_of

# One engine process for the module: its tests share one worker.
pytestmark = pytest.mark.xdist_group("fleet/test_weight_version_header")

COMPLETION = {"prompt": "hello", "max_tokens": 2, "temperature": 0.0}


@pytest.fixture(scope="module")
def engine(tiny: TinyModels) -> Iterator[str]:
    """A real engine process serving ``tiny.step1`` as version ``v1``."""
    with engine_process(["--model", str(tiny.base)]) as url, httpx.Client(timeout=60.0) as client:
        loaded = client.post(f"{url}/update_weights_from_disk",
                             json={"model_path": str(tiny.step1), "weight_version": "v1"})
        assert loaded.status_code == 200, loaded.text
        yield url


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", ["/v1/completions", "/generate"])
def test_the_cpu_engine_refuses_a_request_for_another_weight_version(engine: str, path: str) -> None:
    body = COMPLETION if path == "/v1/completions" else {"text": "hello",
                                                         "sampling_params": {"max_new_tokens": 2}}
    with httpx.Client(base_url=engine, timeout=60.0) as client:
        assert client.post(path, json=body, headers={VERSION_HEADER: "v1"}).status_code == 200
        assert client.post(path, json=body).status_code == 200  # no header: not checked
        refused = client.post(path, json=body, headers={VERSION_HEADER: "v0"})
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert (error["type"], error["requested_version"], error["served_version"]) == (
        MISMATCH, "v0", "v1")
    assert "serves weight version 'v1'" in error["message"]


@pytest.mark.timeout(300)
async def test_the_gate_in_front_of_the_cpu_engine_turns_another_version_into_pin_violation(
    engine: str, nursery: trio.Nursery
) -> None:
    gate = RequestGate([engine], expected_version="v0")
    url = await nursery.start(gate.serve)
    async with httpx.AsyncClient(timeout=60.0) as client:
        response = await client.post(f"{url}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert response.status_code == 502
    assert isinstance(gate.failure, StaleWeightsError)
    assert (gate.failure.expected, gate.failure.actual) == ("v0", "v1")
    assert gate.failure.reason == "pin_violation"


async def test_an_answer_generated_while_the_version_changed_is_withheld(
    nursery: trio.Nursery,
) -> None:
    host = GatedHost()
    engine = CountingEngine(host, max_batch=4)
    async with client_of(engine) as client, trio.open_nursery() as asking:
        answers: list[httpx.Response] = []

        async def ask() -> None:
            answers.append(await client.post("/v1/completions", json={"prompt": [1, 2],
                                              "max_tokens": 1}, headers={VERSION_HEADER: "default"}))

        asking.start_soon(ask)
        await engine.wait_queued(1)
        nursery.start_soon(engine.run)
        await trio.to_thread.run_sync(host.generating.wait, 10)
        host.version = "step_2"  # the weights swapped under the request
        host.release.set()
    [answer] = answers
    assert answer.status_code == 409
    assert answer.json()["error"]["served_version"] == "step_2"


def versionless_server(served: list[str]) -> httpx.ASGITransport:
    """A server like vLLM: answers that report no version, behind the version middleware
    (serving ``served[0]``)."""

    async def completions(request: Request) -> JSONResponse:
        return JSONResponse({"choices": [{"index": 0, "text": "x"}]})

    async def version(scope: object) -> str:
        return served[0]

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
    return httpx.ASGITransport(app=WeightVersionMiddleware(app, served_version=version))


async def test_the_gate_reads_a_version_refusal_as_stale_weights_where_answers_report_none(
    nursery: trio.Nursery,
) -> None:
    served = ["7"]
    gate = RequestGate(["http://a"], expected_version="7", transport=versionless_server(served))
    url = await nursery.start(gate.serve)
    async with httpx.AsyncClient() as client:
        assert (await client.post(f"{url}/v1/completions", json={})).status_code == 200
        served[0] = "8"
        refused = await client.post(f"{url}/v1/completions", json={})
    assert refused.status_code == 502
    assert isinstance(gate.failure, StaleWeightsError)
    assert (gate.failure.expected, gate.failure.actual) == ("7", "8")

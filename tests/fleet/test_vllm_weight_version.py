"""The vLLM tier: a vLLM server started as actorsys starts one enforces the request gate's
version header through actorsys' middleware (vLLM's answers report no version): a request for
another version than ``/weight_info`` reads is refused 409, after the key is checked, and the
gate in front of it turns that refusal into ``pin_violation``."""

from __future__ import annotations

import httpx
import pytest
import trio

from actorsys.evals._door.gate import RequestGate
from actorsys.fleet import StaleWeightsError
from actorsys.fleet.vllm_worker.actorsys_weight_version import MISMATCH, VERSION_HEADER
from tests.fleet.conftest import VLLM_TIER
from tests.fleet.vllm_server import SharedVLLM

pytestmark = VLLM_TIER


@pytest.mark.timeout(600)
async def test_vllm_refuses_a_request_for_another_version_and_the_gate_reads_pin_violation(
    tiny_vllm: SharedVLLM, nursery: trio.Nursery
) -> None:
    key = {"authorization": f"Bearer {tiny_vllm.api_key}"}
    body = {"model": str(tiny_vllm.model_dir), "prompt": "hello", "max_tokens": 2,
            "temperature": 0.0}
    async with httpx.AsyncClient(base_url=tiny_vllm.url, timeout=120.0) as client:
        served = (await client.get("/weight_info", headers=key)).json()["weight_version"]
        answered = await client.post("/v1/completions", json=body,
                                     headers={**key, VERSION_HEADER: served})
        assert answered.status_code == 200, answered.text
        assert "metadata" not in answered.json() or not answered.json().get("metadata")
        refused = await client.post("/v1/completions", json=body,
                                    headers={**key, VERSION_HEADER: f"not-{served}"})
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert (error["type"], error["served_version"]) == (MISMATCH, served)
        # the key is checked first: without it, no version is told
        unkeyed = await client.post("/v1/completions", json=body, headers={VERSION_HEADER: "x"})
        assert unkeyed.status_code == 401

    gate = RequestGate([tiny_vllm.url], expected_version=f"not-{served}",
                       api_key=tiny_vllm.api_key)
    url = await nursery.start(gate.serve)
    async with httpx.AsyncClient(timeout=120.0) as client:
        response = await client.post(f"{url}/v1/completions", json=body)
    assert response.status_code == 502
    assert isinstance(gate.failure, StaleWeightsError)
    assert gate.failure.actual == served

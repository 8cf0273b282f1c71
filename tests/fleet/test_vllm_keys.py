"""vLLM started by a fleet requires the fleet's key on every route but /health, the dev-mode
routes that swap and label the weights included (vLLM's own --api-key guards only /v1/...),
and the fleet's clients pin and complete with it. One real vLLM server (~40 s, ~2 GB)."""

from __future__ import annotations

import httpx
import pytest

from actorsys.fleet.local import LocalFleet, vllm
from tests.fleet.conftest import VLLM_PYTHON, VLLM_TIER, TinyModels
from tests.models import PROMPTS

pytestmark = VLLM_TIER

DEV_ROUTES = [
    ("POST", "/pause"),
    ("POST", "/resume"),
    ("POST", "/collective_rpc"),
    ("POST", "/update_weight_version"),
    ("GET", "/weight_info"),
    ("POST", "/sleep"),
    ("POST", "/reset_prefix_cache"),
    ("GET", "/v1/models"),
    ("POST", "/v1/completions"),
    ("POST", "/tokenize"),
]


@pytest.mark.timeout(600)
async def test_a_fleets_vllm_server_requires_the_key_on_its_dev_routes_and_pins_with_it(
    tiny: TinyModels,
) -> None:
    spec = vllm(str(tiny.base), python=str(VLLM_PYTHON))
    async with LocalFleet.open([spec], startup_timeout=400) as local:
        url = local.urls[0]
        async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            assert (await client.get("/health")).status_code == 200
            for method, path in DEV_ROUTES:
                body = {"new_version": "evil", "method": "reload_weights"}
                response = await client.request(method, path, json=body)
                assert response.status_code == 401, (method, path, response.text)
            wrong = await client.get("/weight_info", headers={"Authorization": "Bearer no"})
            assert wrong.status_code == 401
        await local.fleet.pin(str(tiny.step1), "1")
        assert await local.fleet.engines[0].weight_version() == "1"
        answers = await local.fleet.complete(PROMPTS, max_tokens=4)
        assert len(answers) == len(PROMPTS)

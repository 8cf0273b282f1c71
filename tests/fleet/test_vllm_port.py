"""A local fleet's vLLM server, started as a user's fleet starts it: it requires the fleet's key
on every route but /health, the dev-mode routes that swap and label the weights included
(vLLM's own --api-key guards only /v1/...), and the fleet's clients pin and complete with it;
it serves the socket the fleet bound (``actorsys_vllm_serve --listen-fd``), so its port is
never free, also while the server is restarted, and the restarted server serves its initial
weights, behind the same key. One launch and one restart. Skipped when .venv-vllm is
missing."""

from __future__ import annotations

import httpx
import psutil
import pytest

from actorsys.fleet.local import LocalFleet, vllm
from tests.fleet.conftest import VLLM_PYTHON, VLLM_TIER, TinyModels, kill_and_see_the_port_held
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


async def assert_keyed(client: httpx.AsyncClient, key: str) -> None:
    """Every route but /health refuses a request without the key or with a wrong one."""
    assert (await client.get("/health")).status_code == 200
    for method, path in DEV_ROUTES:
        body = {"new_version": "evil", "method": "reload_weights"}
        response = await client.request(method, path, json=body)
        assert response.status_code == 401, (method, path, response.text)
    wrong = await client.get("/weight_info", headers={"Authorization": "Bearer no"})
    assert wrong.status_code == 401
    keyed = await client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert keyed.status_code == 200


@pytest.mark.timeout(600)
async def test_a_fleets_vllm_server_requires_the_key_and_its_restart_never_frees_the_port(
    tiny: TinyModels,
) -> None:
    spec = vllm(str(tiny.base), python=str(VLLM_PYTHON))
    async with LocalFleet.open([spec], startup_timeout=400) as local:
        engine = local.engines[0]
        client_engine = local.fleet.engines[0]
        assert await client_engine.weight_version() == "default"
        async with httpx.AsyncClient(base_url=engine.url, timeout=30.0) as client:
            await assert_keyed(client, local.api_key)
            await local.fleet.pin(str(tiny.step1), "1")
            assert await client_engine.weight_version() == "1"
            answers = await local.fleet.complete(PROMPTS, max_tokens=4)
            assert len(answers) == len(PROMPTS)

            pid = engine.process.command_pid()
            assert pid is not None
            command = psutil.Process(pid).cmdline()
            assert "actorsys_vllm_serve" in command and "--listen-fd" in command
            await kill_and_see_the_port_held(engine, 400)
            await assert_keyed(client, local.api_key)
            assert await client_engine.weight_version() == "default"

"""The fleet's key end to end: every engine a fleet starts requires it, every client of ours
sends it (the pin, the probe, completions, the router, the lm-eval gate), and no server we
start listens beyond loopback without one."""

from __future__ import annotations

import httpx
import psutil
import pytest
import trio

from actorsys import Fleet, SGLangEngine, VLLMEngine
from actorsys._errors import ConfigError
from actorsys.evals._door.gate import RequestGate
from actorsys.fleet.local import LocalFleet, embedded, on_host
from actorsys.watch.fleets import attached_fleets
from tests.fleet.conftest import Recorder, TinyModels
from tests.models import PROMPTS


def test_a_fleet_sends_the_one_key_its_engines_hold() -> None:
    keyed = Fleet([SGLangEngine("http://a:1", api_key="k"), VLLMEngine("http://b:1", api_key="k")])
    assert keyed.api_key == "k"
    assert Fleet([SGLangEngine("http://a:1")]).api_key is None
    mixed = Fleet([SGLangEngine("http://a:1", api_key="k"), SGLangEngine("http://b:1", api_key="j")])
    with pytest.raises(ConfigError, match="different API keys"):
        _ = mixed.api_key


def test_every_host_flag_is_replaced_never_appended_after_another() -> None:
    argv = ["serve", "--host", "0.0.0.0", "--port", "1", "--host=::", "--hosts", "x"]
    assert on_host(argv, "10.0.0.5") == [
        "serve", "--host", "10.0.0.5", "--port", "1", "--host=10.0.0.5", "--hosts", "x"
    ]
    assert on_host(["serve", "--port", "1"], "127.0.0.1") == [
        "serve", "--port", "1", "--host", "127.0.0.1"
    ]


async def test_the_gate_sends_the_engines_key_in_place_of_the_clients(
    nursery: trio.Nursery,
) -> None:
    upstream = Recorder(lambda request: httpx.Response(200, json={"choices": []}))
    gate = RequestGate(["http://a"], expected_version=None, api_key="fleet-key",
                       transport=upstream.transport)
    url = await nursery.start(gate.serve)
    async with httpx.AsyncClient(headers={"authorization": "Bearer EMPTY"}) as client:
        await client.post(f"{url}/v1/completions", json={"prompt": "x"})
    async with httpx.AsyncClient() as client:
        await client.post(f"{url}/v1/completions", json={"prompt": "y"})
    assert [r.headers["authorization"] for r in upstream.requests] == ["Bearer fleet-key"] * 2


async def test_watch_attaches_with_the_engine_api_key() -> None:
    async with attached_fleets(["http://a:1", "http://b:1"], fleets=2, flavor="sglang",
                               api_key="k") as fleets:
        assert [fleet.api_key for fleet in fleets] == ["k", "k"]
        assert all(engine.api_key == "k" for fleet in fleets for engine in fleet.engines)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_local_fleet_requires_its_key_and_its_clients_send_it_through_the_router(
    tiny: TinyModels,
) -> None:
    async with LocalFleet.open([embedded(str(tiny.base))] * 2, router=True) as local:
        assert local.api_key and local.fleet.api_key == local.api_key
        assert local.router_url is not None
        body = {"model": "m", "prompt": "the quick", "max_tokens": 2, "temperature": 0.0}
        async with httpx.AsyncClient(timeout=30.0) as client:
            for url in local.urls:
                assert (await client.get(f"{url}/health")).status_code == 200
                load = {"model_path": str(tiny.step2), "weight_version": "evil"}
                refused = await client.post(f"{url}/update_weights_from_disk", json=load)
                assert refused.status_code == 401
            routed = await client.post(f"{local.router_url}/v1/completions", json=body)
            assert routed.status_code == 401
            intruder = await client.post(f"{local.router_url}/workers",
                                         json={"url": "http://127.0.0.1:9"})
            assert intruder.status_code == 401
            keyed = await client.post(f"{local.router_url}/v1/completions", json=body,
                                      headers={"Authorization": f"Bearer {local.api_key}"})
            assert keyed.status_code == 200, keyed.text
        await local.fleet.pin(str(tiny.step1), "1")  # health, load, version, weight probe
        answers = await local.fleet.complete(PROMPTS, max_tokens=4)
        assert {answer.weight_version for answer in answers} == {"1"}
        for engine in local.engines:
            pid = engine.process.command_pid()
            assert pid is not None
            listening = {c.laddr.ip for c in psutil.Process(pid).net_connections("tcp")
                         if c.status == psutil.CONN_LISTEN}
            assert listening == {"127.0.0.1"}

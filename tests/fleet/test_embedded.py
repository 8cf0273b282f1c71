"""The embedded engine's HTTP API, in process: a real tiny model behind the real ASGI app."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from actorsys import Fleet, SGLangEngine
from actorsys.fleet import CheckpointRejectedError
from actorsys.fleet.embedded.model import ModelHost
from actorsys.fleet.embedded.server import EmbeddedEngine
from tests.fleet.conftest import TinyModels, corrupt_copy
from tests.models import PROMPTS, greedy

URL = "http://engine"


async def open_engine(
    model_dir: Path, nursery: trio.Nursery, **options: Any
) -> tuple[EmbeddedEngine, httpx.AsyncClient]:
    host = await trio.to_thread.run_sync(lambda: ModelHost(str(model_dir), **options))
    engine = EmbeddedEngine(host, max_batch=8)
    nursery.start_soon(engine.run)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=engine.app()), base_url=URL)
    return engine, client


@pytest.fixture
async def served(tiny: TinyModels, nursery: trio.Nursery) -> AsyncIterator[httpx.AsyncClient]:
    _, client = await open_engine(tiny.base, nursery)
    async with client:
        yield client


async def completions(client: httpx.AsyncClient, prompts: list[str], **body: Any) -> dict[str, Any]:
    response = await client.post(
        "/v1/completions", json={"prompt": prompts, "max_tokens": 8, "temperature": 0.0, **body}
    )
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def texts(result: dict[str, Any]) -> list[str]:
    return [choice["text"] for choice in result["choices"]]


async def test_greedy_completions_equal_transformers_generate_batched_or_alone(
    served: httpx.AsyncClient, tiny: TinyModels
) -> None:
    expected = await trio.to_thread.run_sync(greedy, tiny.base, PROMPTS, 8)
    batched = await completions(served, PROMPTS)
    assert texts(batched) == expected
    alone: dict[int, str] = {}

    async def one(index: int) -> None:
        alone[index] = texts(await completions(served, [PROMPTS[index]]))[0]

    async with trio.open_nursery() as nursery:
        for index in range(len(PROMPTS)):
            nursery.start_soon(one, index)
    assert [alone[i] for i in range(len(PROMPTS))] == expected
    assert batched["metadata"] == {"weight_version": "default"}


async def test_load_swaps_weights_and_every_answer_carries_the_new_version(
    served: httpx.AsyncClient, tiny: TinyModels
) -> None:
    response = await served.post(
        "/update_weights_from_disk", json={"model_path": str(tiny.step1), "weight_version": "1"}
    )
    assert response.json()["success"] is True
    info = (await served.get("/model_info")).json()
    assert (info["weight_version"], info["model_path"]) == ("1", str(tiny.step1))
    assert (await served.get("/get_weight_version")).json() == {"weight_version": "1"}
    result = await completions(served, PROMPTS)
    assert texts(result) == await trio.to_thread.run_sync(greedy, tiny.step1, PROMPTS, 8)
    assert result["metadata"]["weight_version"] == "1"
    generated = await served.post(
        "/generate", json={"text": PROMPTS[0], "sampling_params": {"max_new_tokens": 4}}
    )
    assert generated.json()["meta_info"]["weight_version"] == "1"
    assert len(generated.json()["output_ids"]) <= 4


@pytest.mark.parametrize("problem", ["missing", "incomplete", "other_arch", "corrupt"])
async def test_refused_load_answers_400_with_the_reason_and_keeps_the_previous_weights(
    served: httpx.AsyncClient, tiny: TinyModels, tmp_path: Path, problem: str
) -> None:
    await served.post(
        "/update_weights_from_disk", json={"model_path": str(tiny.step1), "weight_version": "1"}
    )
    before = texts(await completions(served, PROMPTS))
    body: dict[str, Any] = {"weight_version": "2"}
    if problem == "missing":
        body["model_path"], reason = str(tmp_path / "absent"), "is not a directory"
    elif problem == "incomplete":
        shutil.copytree(tiny.step2, tmp_path / "incomplete")
        (tmp_path / "incomplete" / ".complete").unlink()
        body["model_path"], reason = str(tmp_path / "incomplete"), "no .complete marker"
        body["require_complete"] = True
    elif problem == "other_arch":
        body["model_path"], reason = str(tiny.other_arch), "architecture differs"
    else:
        body["model_path"] = str(corrupt_copy(tiny.step2, tmp_path / "corrupt"))
        reason = "corrupt header"
    response = await served.post("/update_weights_from_disk", json=body)
    assert response.status_code == 400
    assert response.json()["success"] is False
    assert reason in response.json()["message"]
    assert (await served.get("/get_weight_version")).json() == {"weight_version": "1"}
    assert texts(await completions(served, PROMPTS)) == before


async def test_engine_told_to_keep_old_weights_says_success_but_serves_the_old_version(
    tiny: TinyModels, nursery: trio.Nursery
) -> None:
    _, client = await open_engine(tiny.base, nursery, keep_old_weights=True)
    async with client:
        response = await client.post(
            "/update_weights_from_disk", json={"model_path": str(tiny.step1), "weight_version": "1"}
        )
        assert response.json()["success"] is True
        assert (await client.get("/get_weight_version")).json() == {"weight_version": "default"}
        expected = await trio.to_thread.run_sync(greedy, tiny.base, PROMPTS, 8)
        assert texts(await completions(client, PROMPTS)) == expected


async def test_sampling_with_a_seed_is_repeatable(served: httpx.AsyncClient) -> None:
    first = texts(await completions(served, PROMPTS, temperature=1.0, seed=7, max_tokens=16))
    again = texts(await completions(served, PROMPTS, temperature=1.0, seed=7, max_tokens=16))
    other = texts(await completions(served, PROMPTS, temperature=1.0, seed=8, max_tokens=16))
    assert first == again
    assert first != other


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
        ({"prompt": "x", "temperature": "hot"}, "temperature"),
        ({"prompt": "x", "max_tokens": 10_000}, "exceeds the model's 512 positions"),
        ({"max_tokens": 3}, "prompt"),
        ({"prompt": "x", "stream": True}, "stream"),
    ],
)
async def test_bad_completion_requests_are_400_naming_the_field(
    served: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    response = await served.post("/v1/completions", json=body)
    assert response.status_code == 400
    assert field in response.json()["error"]["message"]


async def test_sglang_client_pins_the_embedded_engine(
    tiny: TinyModels, nursery: trio.Nursery
) -> None:
    engine, client = await open_engine(tiny.base, nursery)
    await client.aclose()
    transport = httpx.ASGITransport(app=engine.app())
    fleet = Fleet([SGLangEngine(URL, transport=transport)])
    await fleet.pin(str(tiny.step1), "1")
    assert fleet.version == "1"
    assert engine.host.version == "1"
    with pytest.raises(CheckpointRejectedError, match="architecture differs"):
        await fleet.pin(str(tiny.other_arch), "2")
    assert engine.host.version == "1"

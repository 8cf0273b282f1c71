"""The CPU engine's batches stay within ``max_batch``: a request of more sequences (``n=256``, a
list of prompts) is generated in slices, the requests queued after it share the next batches,
a weight load waits until the sliced request is whole (its answers come from one checkpoint),
and a chat request that names no ``max_tokens`` gets a bounded default. In process with a
fake host where the test must see the batches, and against the real engine process."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import trio

from actorsys.fleet.embedded.model import GenerationRequest, GenerationResult
from actorsys.fleet.embedded.requests import DEFAULT_MAX_TOKENS, default_max_tokens
from tests.chat_models import make_tool_chat_model
from tests.engine_process import engine_process
from tests.fleet.test_engine_hardening import CountingEngine, FakeHost, client_of

# One engine process for the module: its tests share one worker.
pytestmark = pytest.mark.xdist_group("fleet/test_engine_batches")

GENERATION_MAX_TOKENS = 48
"""The ``max_new_tokens`` of the real chat model's ``generation_config.json``."""


class GatedHost(FakeHost):
    """A fake host whose first batch waits until the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self.generating = threading.Event()
        self.release = threading.Event()

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        if not self.generating.is_set():
            self.generating.set()
            assert self.release.wait(10), "the test never released the first batch"
        return super().generate(requests)


def prompts(count: int) -> dict[str, Any]:
    return {"prompt": [[1, 2]] * count, "max_tokens": 1}


async def until(ready: Callable[[], bool]) -> None:
    # a body is parsed, and a load checked, in a worker thread that no trio event reports
    with trio.fail_after(30):
        while not ready():  # noqa: ASYNC110
            await trio.sleep(0.01)


async def test_a_request_larger_than_max_batch_is_sliced_and_later_requests_share_its_batches(
    nursery: trio.Nursery,
) -> None:
    host = FakeHost()
    engine = CountingEngine(host, max_batch=4)
    finished: list[str] = []
    async with client_of(engine) as client:

        async def send(name: str, count: int) -> None:
            response = await client.post("/v1/completions", json=prompts(count))
            assert response.status_code == 200, response.text
            assert len(response.json()["choices"]) == count
            finished.append(name)

        async with trio.open_nursery() as senders:
            senders.start_soon(send, "large", 10)
            await engine.wait_queued(1)
            senders.start_soon(send, "small", 1)
            await engine.wait_queued(2)
            nursery.start_soon(engine.run)
    # the large request's first slice, then the small one beside its second, then its rest
    assert host.batches == [4, 4, 3]
    assert finished == ["small", "large"]


async def test_a_weight_load_waits_until_a_sliced_request_is_whole(nursery: trio.Nursery) -> None:
    host = GatedHost()
    engine = CountingEngine(host, max_batch=4)
    answers: dict[str, httpx.Response] = {}
    async with client_of(engine) as client:

        async def post(name: str, path: str, body: dict[str, Any]) -> None:
            answers[name] = await client.post(path, json=body)

        async with trio.open_nursery() as senders:
            senders.start_soon(post, "large", "/v1/completions", prompts(10))
            await engine.wait_queued(1)
            nursery.start_soon(engine.run)
            await trio.to_thread.run_sync(host.generating.wait, 10)
            senders.start_soon(post, "load", "/update_weights_from_disk",
                               {"model_path": "/fake/step_2", "weight_version": "step_2"})
            await until(lambda: engine._loads_waiting == 1)
            host.release.set()
    assert answers["load"].status_code == 200, answers["load"].text
    assert answers["large"].json()["metadata"]["weight_version"] == "default"
    assert host.batches == [4, 4, 2]
    assert host.version == "step_2"


@pytest.mark.parametrize(
    ("positions", "generation", "prompt", "expected"),
    [
        (32768, None, 100, DEFAULT_MAX_TOKENS),  # bounded, where vLLM gives 32668
        (32768, 48, 100, 48),  # the model's generation_config.json, as vLLM takes it
        (1000, None, 990, 10),  # never past the context
        (1000, 4096, 999, 1),
    ],
)
def test_a_chat_request_without_max_tokens_gets_a_default_that_fits(
    positions: int, generation: int | None, prompt: int, expected: int
) -> None:
    host = SimpleNamespace(max_positions=positions, generation_max_tokens=generation)
    assert default_max_tokens(host, prompt) == expected


@pytest.fixture(scope="module")
def chat_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real engine process of batches of 4, serving a chat model whose generation config
    names ``max_new_tokens``."""
    model = make_tool_chat_model(tmp_path_factory.mktemp("batches") / "model", seed=5)
    config_path = Path(model) / "generation_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "max_new_tokens": GENERATION_MAX_TOKENS}))
    with engine_process(["--model", str(model), "--max-batch", "4"]) as url:
        yield url


@pytest.mark.timeout(300)
def test_a_chat_request_of_large_n_without_max_tokens_is_bounded_and_shares_the_engine(
    chat_engine: str,
) -> None:
    messages = [{"role": "user", "content": "count to a hundred"}]
    # 32 batches of 4: well over the wait below and the small request's parse (the large
    # request must still be generating when the small one arrives)
    big = {"messages": messages, "n": 128, "ignore_eos": True, "temperature": 1.0, "seed": 1}
    small = {"messages": messages, "max_tokens": 1, "temperature": 0.0}
    with httpx.Client(base_url=chat_engine, timeout=240.0) as client, ThreadPoolExecutor(2) as pool:

        def ask(body: dict[str, Any]) -> tuple[httpx.Response, float]:
            response = client.post("/v1/chat/completions", json=body)
            return response, time.monotonic()

        # Two chat requests at once first: the render workers they start (a process each,
        # about a second on a busy machine) are then warm for both requests measured.
        warm = [pool.submit(ask, small) for _ in range(2)]
        assert all(f.result()[0].status_code == 200 for f in warm)
        large = pool.submit(ask, big)
        time.sleep(0.3)  # a real process: the large request is generating by now
        started = time.monotonic()
        answered, small_done = pool.submit(ask, small).result()
        response, large_done = large.result()
    assert answered.status_code == 200 and response.status_code == 200, response.text
    body = response.json()
    assert len(body["choices"]) == 128
    assert body["usage"]["completion_tokens"] == 128 * GENERATION_MAX_TOKENS
    assert all(choice["finish_reason"] == "length" for choice in body["choices"])
    # the small request joined the next batch instead of waiting for all 128 sequences
    assert small_done < large_done, (small_done - started, large_done - started)

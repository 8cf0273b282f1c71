"""The embedded engine against requests meant to break it: no key, bad sampling values, too
many prompts, large and malformed bodies. In process: the real ASGI app, and the real tiny
model where generation matters (a fake host where the test must control the model)."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actorsys import SGLangEngine
from actorsys.fleet.embedded.model import GenerationRequest, GenerationResult, ModelHost
from actorsys.fleet.embedded.requests import MAX_SEQUENCES
from actorsys.fleet.embedded.server import PARSE_THREADS, EmbeddedEngine
from actorsys.fleet.vllm_worker.actorsys_api_key import ApiKeyMiddleware
from tests.engine_process import engine_process as serve_engine
from tests.fleet.conftest import TinyModels

# One engine process for the module: its tests share one worker.
pytestmark = pytest.mark.xdist_group("fleet/test_engine_hardening")

URL = "http://engine"
KEY = "the-fleet-key"


class FakeHost:
    """Just enough of a ModelHost: one token per request. ``poison`` requests (those with
    that seed) make the whole batch raise, as a model fault would; ``encode`` can be held
    until the test releases it."""

    def __init__(self, poison_seed: int | None = None) -> None:
        self.model_dir = self.model_path = "/fake"
        self.version = "default"
        self.max_positions, self.vocab_size, self.pad_id = 64, 100, 0
        self.poison_seed = poison_seed
        self.batches: list[int] = []
        self.loads: list[str] = []
        self.encoding = threading.Event()
        self.release_encode: threading.Event | None = None
        self.released_in_time: bool | None = None

    def encode(self, text: str) -> list[int]:
        self.encoding.set()
        if self.release_encode is not None:
            self.released_in_time = self.release_encode.wait(timeout=10)
        return [1 + (ord(c) % 90) for c in text[:8]] or [1]

    def decode(self, ids: list[int]) -> str:
        return "x" * len(ids)

    def token_text(self, token_id: int) -> str:
        return "x"

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self.batches.append(len(requests))
        if self.poison_seed is not None and any(r.seed == self.poison_seed for r in requests):
            raise RuntimeError("the model failed on this batch")
        return [GenerationResult([5], "length", self.version) for _ in requests]

    def check(self, path: str, *, require_complete: bool) -> None:
        pass

    def load(self, path: str, version: str | None, *, require_complete: bool) -> None:
        self.loads.append(path)
        self.version = version or self.version


def client_of(engine: EmbeddedEngine, **headers: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=engine.app())
    return httpx.AsyncClient(transport=transport, base_url=URL, headers=headers)


class CountingEngine(EmbeddedEngine):
    """Counts the requests queued for generation, so a test can start the batch loop once
    the requests it sent all wait in the queue (and are therefore generated together)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queued = 0
        self._waiters: list[tuple[int, trio.Event]] = []

    async def generate(self, requests: Any, *, priority: int = 0) -> Any:
        self.queued += 1
        for count, event in self._waiters:
            if self.queued >= count:
                event.set()
        return await super().generate(requests, priority=priority)

    async def wait_queued(self, count: int) -> None:
        event = trio.Event()
        self._waiters.append((count, event))
        if self.queued >= count:
            event.set()
        await event.wait()


@pytest.fixture
async def stopped_engine(tiny: TinyModels) -> CountingEngine:
    """The real tiny model, its batch loop not started yet."""
    host = await trio.to_thread.run_sync(lambda: ModelHost(str(tiny.base)))
    return CountingEngine(host, max_batch=8)


@pytest.fixture
async def real(
    stopped_engine: CountingEngine, nursery: trio.Nursery
) -> AsyncIterator[httpx.AsyncClient]:
    nursery.start_soon(stopped_engine.run)
    async with client_of(stopped_engine) as client:
        yield client


def message(response: httpx.Response) -> str:
    text: str = response.json()["error"]["message"]
    return text


# --- the key ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong", f"Basic {KEY}", KEY, "Bearer ", f"Bearer {KEY}x"]
)
async def test_every_route_but_health_refuses_a_request_without_the_key(
    authorization: str | None, nursery: trio.Nursery
) -> None:
    host = FakeHost()
    engine = EmbeddedEngine(host, api_key=KEY)  # type: ignore[arg-type]
    nursery.start_soon(engine.run)
    headers = {"Authorization": authorization} if authorization is not None else {}
    async with client_of(engine, **headers) as client:
        assert (await client.get("/health")).status_code == 200
        for method, path in [("GET", "/model_info"), ("GET", "/get_weight_version"),
                             ("GET", "/v1/models"), ("GET", "/health_generate"),
                             ("POST", "/generate"), ("POST", "/v1/completions"),
                             ("POST", "/update_weights_from_disk"), ("GET", "/no/such/route")]:
            response = await client.request(method, path, json={"model_path": "/elsewhere"})
            assert response.status_code == 401, (method, path, response.text)
            assert "Authorization: Bearer" in message(response)
            # The unread body ends the connection: the client is told not to reuse it.
            assert response.headers["connection"] == "close"
    assert host.loads == [] and host.batches == []


async def test_the_clients_pin_and_complete_on_an_engine_with_a_key(nursery: trio.Nursery) -> None:
    host = FakeHost()
    engine = EmbeddedEngine(host, api_key=KEY)  # type: ignore[arg-type]
    nursery.start_soon(engine.run)
    transport = httpx.ASGITransport(app=engine.app())
    client = SGLangEngine(URL, api_key=KEY, transport=transport)
    await client.health()
    await client.load_weights("/snapshots/step_1", "1")
    assert await client.weight_version() == "1"
    assert await client.greedy_tokens([[1, 2]], 1) == [[5]]
    assert host.loads == ["/snapshots/step_1"]
    keyless = SGLangEngine(URL, transport=transport)
    with pytest.raises(Exception, match="401"):
        await keyless.load_weights("/snapshots/step_2", "2")
    assert host.loads == ["/snapshots/step_1"]


def test_the_middleware_never_starts_open(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="VLLM_API_KEY"):
        ApiKeyMiddleware(lambda scope, receive, send: None)  # type: ignore[arg-type,return-value]


# --- sampling values, one request at a time ----------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"prompt": "the quick", "max_tokens": 2, "temperature": NaN}', "temperature"),
        ('{"prompt": "the quick", "max_tokens": 2, "temperature": 1e-300}', "temperature"),
        ('{"prompt": "the quick", "max_tokens": 2, "temperature": 1e999}', "temperature"),
        ('{"prompt": "the quick", "max_tokens": 2, "temperature": -1}', "temperature"),
        ('{"prompt": "the quick", "max_tokens": 2, "top_p": NaN}', "top_p"),
        ('{"prompt": "the quick", "max_tokens": 2, "seed": 1180591620717411303424}', "seed"),
        ('{"prompt": [1, true, 3], "max_tokens": 2}', "prompt"),
        ('{"prompt": "x", "max_tokens": 2, "stop": ' + json.dumps(["s"] * 40) + "}", "stop"),
    ],
)
async def test_a_bad_sampling_value_is_a_400_naming_it_and_the_requests_beside_it_are_answered(
    raw: str, field: str, stopped_engine: CountingEngine, nursery: trio.Nursery
) -> None:
    answers: dict[str, httpx.Response] = {}
    bad_answered = trio.Event()
    good = json.dumps({"prompt": "engines load", "max_tokens": 3, "temperature": 0.7, "seed": 1})
    async with client_of(stopped_engine, **{"content-type": "application/json"}) as client:

        async def send(name: str, content: str) -> None:
            answers[name] = await client.post("/v1/completions", content=content)
            if name == "bad":
                bad_answered.set()

        async def first_of(*waits: Any) -> None:
            async with trio.open_nursery() as race:
                for wait in waits:
                    race.start_soon(lambda wait=wait: _then_cancel(wait, race.cancel_scope))

        async with trio.open_nursery() as senders:
            senders.start_soon(send, "bad", raw)
            for index in range(3):
                senders.start_soon(send, f"good{index}", good)
            await stopped_engine.wait_queued(3)
            await first_of(bad_answered.wait, lambda: stopped_engine.wait_queued(4))
            nursery.start_soon(stopped_engine.run)  # everything queued is generated in one batch
    assert answers["bad"].status_code == 400, answers["bad"].text
    assert message(answers["bad"]).startswith(field)
    for index in range(3):
        assert answers[f"good{index}"].status_code == 200, answers[f"good{index}"].text


async def _then_cancel(wait: Any, scope: trio.CancelScope) -> None:
    await wait()
    scope.cancel()


async def test_a_request_that_fails_its_batch_fails_alone(nursery: trio.Nursery) -> None:
    host = FakeHost(poison_seed=13)
    engine = CountingEngine(host, max_batch=8)
    answers: dict[int, httpx.Response] = {}
    async with client_of(engine) as client:

        async def send(seed: int) -> None:
            body = {"prompt": [1, 2], "max_tokens": 1, "temperature": 1.0, "seed": seed}
            answers[seed] = await client.post("/v1/completions", json=body)

        async with trio.open_nursery() as senders:
            for seed in (1, 13, 2, 3):
                senders.start_soon(send, seed)
            await engine.wait_queued(4)
            nursery.start_soon(engine.run)  # one batch of all four, then each alone
    assert host.batches[0] == 4
    assert answers[13].status_code == 500
    assert "generation failed" in message(answers[13])
    assert [answers[seed].status_code for seed in (1, 2, 3)] == [200, 200, 200]


# --- sizes -------------------------------------------------------------------------------


async def test_more_prompts_than_a_request_may_hold_is_a_400(real: httpx.AsyncClient) -> None:
    response = await real.post("/v1/completions",
                               json={"prompt": ["the quick"] * 3000, "max_tokens": 1})
    assert response.status_code == 400
    assert message(response) == f"prompt: at most {MAX_SEQUENCES} prompts per request"


async def test_a_body_over_the_limit_is_a_413_declared_or_streamed(nursery: trio.Nursery) -> None:
    engine = EmbeddedEngine(FakeHost(), max_body_bytes=1000)  # type: ignore[arg-type]
    nursery.start_soon(engine.run)
    body = json.dumps({"prompt": "y" * 5000, "max_tokens": 1}).encode()

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 512):
            yield body[start : start + 512]

    async with client_of(engine) as client:
        declared = await client.post("/v1/completions", content=body)
        streamed = await client.post("/v1/completions", content=chunks())
        fits = await client.post("/v1/completions", json={"prompt": "y", "max_tokens": 1})
    for response in (declared, streamed):
        assert response.status_code == 413
        assert "1000 bytes" in message(response)
    assert fits.status_code == 200


async def test_tokenizing_a_prompt_never_stalls_the_event_loop(nursery: trio.Nursery) -> None:
    host = FakeHost()
    host.release_encode = threading.Event()
    engine = EmbeddedEngine(host)  # type: ignore[arg-type]
    nursery.start_soon(engine.run)
    answers: list[httpx.Response] = []
    async with client_of(engine) as client:

        async def complete() -> None:
            answers.append(await client.post("/v1/completions",
                                             json={"prompt": "long", "max_tokens": 1}))

        async with trio.open_nursery() as requests:
            requests.start_soon(complete)
            await trio.to_thread.run_sync(host.encoding.wait)
            health = await client.get("/health")  # answered while the prompt is tokenized
            host.release_encode.set()
    assert health.status_code == 200
    assert host.released_in_time is True
    assert answers[0].status_code == 200


class HeldHost(FakeHost):
    """A :class:`FakeHost` whose ``encode`` holds every caller until ``release`` is set,
    releasing ``held`` once per caller it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.held = threading.Semaphore(0)
        self.release = threading.Event()

    def encode(self, text: str) -> list[int]:
        self.held.release()
        self.release.wait(timeout=60)
        return super().encode(text)


async def test_health_is_503_while_every_parse_thread_is_stuck_and_200_once_they_free(
    nursery: trio.Nursery,
) -> None:
    host = HeldHost()
    engine = EmbeddedEngine(host, parse_stuck_after=3600.0)  # type: ignore[arg-type]
    nursery.start_soon(engine.run)
    answers: list[httpx.Response] = []
    async with client_of(engine) as client:

        async def complete() -> None:
            answers.append(await client.post("/v1/completions",
                                             json={"prompt": "held", "max_tokens": 1}))

        async with trio.open_nursery() as requests:
            for _ in range(PARSE_THREADS):
                requests.start_soon(complete)
            for _ in range(PARSE_THREADS):
                await trio.to_thread.run_sync(host.held.acquire)
            busy = await client.get("/health")  # every thread busy, none for long yet
            engine.parse_stuck_after = 0.0
            stuck = await client.get("/health")
            load = await client.post("/update_weights_from_disk",
                                     json={"model_path": "/fake/next", "weight_version": "v2"})
            host.release.set()
        freed = await client.get("/health")
    assert busy.status_code == 200
    assert stuck.status_code == 503
    assert f"every parse thread ({PARSE_THREADS})" in stuck.json()["message"]
    assert load.status_code == 200, load.text  # weight loads parse on a limiter of their own
    assert host.loads == ["/fake/next"]
    assert freed.status_code == 200
    assert [a.status_code for a in answers] == [200] * PARSE_THREADS


# --- malformed bodies: always a 4xx that says why, and the engine stays up ------------------


def json_values() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(
        max_size=12
    )
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


FIELDS = ["prompt", "text", "input_ids", "max_tokens", "temperature", "top_p", "seed", "stop",
          "logprobs", "echo", "n", "stream", "sampling_params", "ignore_eos", "model"]
small_ints = st.integers(0, 3)
bodies = st.one_of(
    st.dictionaries(st.sampled_from(FIELDS), json_values(), max_size=6),
    st.fixed_dictionaries(
        {"prompt": st.sampled_from(["the quick", [1, 2, 3], ["a", "b"], [[1], [2, 3]]]),
         "max_tokens": small_ints},
        optional={name: json_values() for name in ["temperature", "top_p", "seed", "stop",
                                                   "logprobs", "echo", "n", "ignore_eos"]},
    ),
    st.fixed_dictionaries(
        {"input_ids": st.sampled_from([[1, 2], [[1], [2, 3]]]),
         "sampling_params": st.fixed_dictionaries(
             {"max_new_tokens": small_ints},
             optional={name: json_values() for name in ["temperature", "top_p", "seed",
                                                        "sampling_seed", "stop"]})},
    ),
    json_values(),
)
raw_bodies = st.one_of(
    bodies.map(lambda body: json.dumps(body).encode()),
    st.binary(max_size=64),
    st.just(b"[" * 200_000 + b"]" * 200_000),
    st.just(b'{"prompt": "\\ud800", "max_tokens": 1}'),
)


@pytest.fixture(scope="module")
def engine_process(tiny: TinyModels) -> Iterator[str]:
    """A real engine process serving the tiny model; its URL."""
    with serve_engine(["--model", str(tiny.base), "--max-batch", "4"]) as url:
        yield url


@pytest.mark.slow
@pytest.mark.timeout(300)
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=raw_bodies, path=st.sampled_from(["/v1/completions", "/generate"]))
def test_any_body_is_answered_below_500_with_a_message_and_the_engine_stays_up(
    raw: bytes, path: str, engine_process: str
) -> None:
    with httpx.Client(base_url=engine_process, timeout=60.0) as client:
        response = client.post(path, content=raw, headers={"content-type": "application/json"})
        assert response.status_code in (200, 400, 413), (raw[:200], response.text)
        if response.status_code != 200:
            assert message(response)
        assert client.get("/health").status_code == 200

"""The priority an evaluation's requests carry, per engine flavor, and the embedded engine
honouring it: loopback servers recording the bodies they get, and a real tiny model."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import h11
import httpx
import pytest
import trio
import trio.testing

from actorsys import Fleet, SGLangEngine, VLLMEngine
from actorsys._errors import ConfigError
from actorsys.evals._door.gate import RequestGate
from actorsys.fleet.clients.priority import (
    SGLANG_LAST_HIGH_FIRST,
    SGLANG_LAST_LOW_FIRST,
    sglang_priority,
    vllm_priority,
)
from actorsys.fleet.embedded.batching import PRIORITY_GRACE, GenerationBatcher
from actorsys.fleet.embedded.model import GenerationRequest, GenerationResult
from tests.fleet.conftest import Recorder, TinyModels
from tests.fleet.test_embedded import open_engine

ANSWER = {"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}


class RecordingServer:
    """An HTTP server on loopback that answers ``/get_server_info`` with ``info`` (404 when
    None), ``/v1/models`` with one model, and every POST with one completion; ``bodies``:
    the JSON of every POST."""

    def __init__(self, info: dict[str, Any] | None) -> None:
        self.info = info
        self.bodies: list[dict[str, Any]] = []

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._connection, listeners)
            task_status.started(f"http://127.0.0.1:{port}")

    async def _connection(self, stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER)
        async with stream:
            while True:
                request, body = None, b""
                while True:
                    event = connection.next_event()
                    if event is h11.NEED_DATA:
                        data = await stream.receive_some(65536)
                        if not data:
                            return
                        connection.receive_data(data)
                    elif isinstance(event, h11.Request):
                        request = event
                    elif isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    else:
                        return
                assert request is not None
                status, content = self._answer(request, body)
                payload = json.dumps(content).encode()
                headers = [("content-type", "application/json"), ("content-length", str(len(payload)))]
                await stream.send_all(connection.send(h11.Response(status_code=status, headers=headers)))
                await stream.send_all(connection.send(h11.Data(data=payload)))
                await stream.send_all(connection.send(h11.EndOfMessage()))
                if connection.our_state is not h11.DONE:
                    return
                connection.start_next_cycle()

    def _answer(self, request: h11.Request, body: bytes) -> tuple[int, Any]:
        path = request.target.decode()
        if request.method == b"POST":
            self.bodies.append(json.loads(body))
            return 200, ANSWER
        if path in ("/get_server_info", "/server_info"):
            return (404, {}) if self.info is None else (200, self.info)
        if path == "/v1/models":
            return 200, {"data": [{"id": "m"}]}
        return 404, {}


async def serving(nursery: trio.Nursery, info: dict[str, Any] | None) -> tuple[RecordingServer, str]:
    server = RecordingServer(info)
    url = await nursery.start(server.serve)
    return server, url


SGLANG_HIGH_FIRST = {"enable_priority_scheduling": True, "default_priority_value": 0}


def test_vllm_is_sent_the_eval_priority_as_it_is_because_lower_goes_first() -> None:
    assert [vllm_priority(n) for n in (0, 1, 7)] == [0, 1, 7]


@pytest.mark.parametrize(
    ("info", "sent"),
    [
        ({}, None),
        ({"enable_priority_scheduling": False, "default_priority_value": 0}, None),
        (SGLANG_HIGH_FIRST, -3),
        ({"enable_priority_scheduling": True, "default_priority_value": 10}, 7),
        ({"enable_priority_scheduling": True}, SGLANG_LAST_HIGH_FIRST),
        ({"enable_priority_scheduling": True, "schedule_low_priority_values_first": True,
          "default_priority_value": 0}, 3),
        ({"enable_priority_scheduling": True, "schedule_low_priority_values_first": True},
         SGLANG_LAST_LOW_FIRST),
        ({"enable_priority_scheduling": True, "default_priority_value": SGLANG_LAST_HIGH_FIRST + 1},
         SGLANG_LAST_HIGH_FIRST),
    ],
)
def test_sglang_is_sent_the_rollouts_default_moved_towards_the_back_within_the_last_place(
    info: dict[str, Any], sent: int | None
) -> None:
    assert sglang_priority(3, info) == sent


def test_eval_priority_must_be_a_non_negative_integer() -> None:
    engine = SGLangEngine("http://127.0.0.1:1")
    assert Fleet([engine]).eval_priority is None
    assert Fleet([engine], eval_priority=2).eval_priority == 2
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ConfigError, match="eval_priority"):
            Fleet([engine], eval_priority=bad)  # type: ignore[arg-type]


async def test_every_engine_is_sent_the_priority_of_its_flavor(nursery: trio.Nursery) -> None:
    vllm, vllm_url = await serving(nursery, None)
    sglang, sglang_url = await serving(nursery, SGLANG_HIGH_FIRST)
    plain, plain_url = await serving(nursery, {"enable_priority_scheduling": False})
    fleet = Fleet(
        [VLLMEngine(vllm_url, name="v"), SGLangEngine(sglang_url, name="s"),
         SGLangEngine(plain_url, name="p")],
        eval_priority=3,
    )
    await fleet.complete([f"q{i}" for i in range(6)], check_version=False)
    assert [body["priority"] for body in vllm.bodies] == [3, 3]
    assert [body["priority"] for body in sglang.bodies] == [-3, -3]
    assert [("priority" in body) for body in plain.bodies] == [False, False]


async def test_a_fleet_without_eval_priority_sends_no_priority(nursery: trio.Nursery) -> None:
    server, url = await serving(nursery, SGLANG_HIGH_FIRST)
    await Fleet([SGLangEngine(url)]).complete(["a", "b"], check_version=False)
    assert len(server.bodies) == 2
    assert not any("priority" in body for body in server.bodies)


async def test_a_router_before_engines_that_order_differently_is_refused(
    nursery: trio.Nursery,
) -> None:
    _, vllm_url = await serving(nursery, None)
    _, sglang_url = await serving(nursery, SGLANG_HIGH_FIRST)
    fleet = Fleet([VLLMEngine(vllm_url, name="v"), SGLangEngine(sglang_url, name="s")],
                  router_url="http://127.0.0.1:1", eval_priority=3)
    with pytest.raises(ConfigError, match="eval_priority"):
        await fleet.eval_priorities()


async def test_the_door_writes_the_fleets_priority_over_what_a_harness_sends(
    nursery: trio.Nursery,
) -> None:
    upstream = Recorder(lambda request: httpx.Response(200, json=ANSWER))
    gate = RequestGate(["http://a"], expected_version=None, transport=upstream.transport)
    gate.priorities = {"http://a": 4}
    url = await nursery.start(gate.serve)
    async with httpx.AsyncClient() as client:
        await client.post(f"{url}/v1/completions", json={"prompt": "p", "priority": -100})
        await client.post(f"{url}/v1/chat/completions", json={"messages": []})
    assert [json.loads(r.content)["priority"] for r in upstream.requests] == [4, 4]


async def test_a_rollout_queued_behind_an_evaluations_requests_is_generated_first(
    tiny: TinyModels, nursery: trio.Nursery
) -> None:
    engine, client = await open_engine(tiny.base, nursery)
    engine.max_batch = 1
    served: list[str] = []

    async def ask(name: str, body: dict[str, Any]) -> None:
        request = {"prompt": "hello", "max_tokens": 2, "temperature": 0.0, **body}
        response = await client.post("/v1/completions", json=request)
        assert response.status_code == 200, response.text
        served.append(name)

    async def until(ready: Callable[[], bool]) -> None:
        # The engine parses a body in a worker thread, which no trio event reports: polled,
        # bounded.
        with trio.fail_after(30):
            while not ready():  # noqa: ASYNC110
                await trio.sleep(0.01)

    async with client, trio.open_nursery() as asking:
        info = (await client.get("/get_server_info")).json()
        assert sglang_priority(2, info) == 2
        # Holding the model's lock keeps the first batch (one eval request) from starting,
        # so the requests after it queue: another eval request, then a rollout.
        await engine.lock.acquire()
        try:
            asking.start_soon(ask, "eval-0", {"priority": 2})
            await until(lambda: engine.lock.statistics().tasks_waiting == 1)
            asking.start_soon(ask, "eval-1", {"priority": 2})
            await until(lambda: len(engine._queue) == 1)
            asking.start_soon(ask, "rollout", {})
            await until(lambda: len(engine._queue) == 2)
        finally:
            engine.lock.release()
    assert served == ["eval-0", "rollout", "eval-1"]


async def test_a_bad_priority_is_refused_naming_the_field(
    tiny: TinyModels, nursery: trio.Nursery
) -> None:
    _, client = await open_engine(tiny.base, nursery)
    async with client:
        for bad in ("high", 1.5, 2**63):
            response = await client.post(
                "/v1/completions", json={"prompt": "a", "max_tokens": 1, "priority": bad}
            )
            assert response.status_code == 400
            assert "priority" in response.text



# --- a rollout loop keeps its place beside an evaluation ---------------------------------

ROLLOUT, EVAL = 1, 2


BATCH_SECONDS = 0.1


class BatchLog:
    """A ModelHost stand-in: one token a sequence; ``batches`` holds each batch's sequences
    by their first input id, and when it started (trio's clock)."""

    def __init__(self) -> None:
        self.batches: list[tuple[float, list[int]]] = []

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self.batches.append((trio.current_time(), [r.input_ids[0] for r in requests]))
        return [GenerationResult([5], "length", "v") for _ in requests]


class ClockedBatcher(GenerationBatcher):
    """Generates on the trio thread, each batch taking ``BATCH_SECONDS`` of trio's clock (a
    worker thread would let an autojump clock jump while it runs)."""

    async def _run_model(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        results = self.host.generate(requests)
        await trio.sleep(BATCH_SECONDS)
        return results


async def batched_beside_an_evaluation(
    *, eval_priority: int, turnaround: float, grace: float = PRIORITY_GRACE
) -> tuple[BatchLog, list[float]]:
    """A rollout loop (8 sequences a request, ``turnaround`` seconds from each answer to its
    next request) for 10 requests, beside an evaluation's 4 requests of 1 sequence always
    queued at ``eval_priority``; the log, and when each rollout request was answered."""
    host = BatchLog()
    batcher = ClockedBatcher(host, max_batch=16, priority_grace=grace)  # type: ignore[arg-type]
    answered: list[float] = []

    async def evaluation() -> None:
        while True:
            await batcher.generate([GenerationRequest([EVAL], 1)], priority=eval_priority)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(batcher.run)
        for _ in range(4):
            nursery.start_soon(evaluation)
        for _ in range(10):
            await batcher.generate([GenerationRequest([ROLLOUT], 1)] * 8)
            answered.append(trio.current_time())
            await trio.sleep(turnaround)
        nursery.cancel_scope.cancel()
    return host, answered


def rollout_batches(host: BatchLog) -> list[list[int]]:
    """The batches up to the last one that held a rollout sequence."""
    last = max(i for i, (_, batch) in enumerate(host.batches) if ROLLOUT in batch)
    return [batch for _, batch in host.batches[: last + 1]]


async def test_a_rollout_loop_turning_around_is_batched_with_the_evaluation_not_after_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    host, _ = await batched_beside_an_evaluation(eval_priority=1, turnaround=0.01)
    batches = rollout_batches(host)
    assert len(batches) == 10
    assert all(batch.count(ROLLOUT) == 8 for batch in batches)
    assert all(batch.count(EVAL) == 4 for batch in batches[1:]), batches  # it kept going too


@pytest.mark.parametrize(
    ("eval_priority", "grace"), [(0, PRIORITY_GRACE), (1, 0.0)], ids=["same-priority", "no-grace"]
)
async def test_without_a_larger_priority_or_a_grace_the_evaluation_batches_alone_between_rollouts(
    autojump_clock: trio.testing.MockClock, eval_priority: int, grace: float
) -> None:
    host, _ = await batched_beside_an_evaluation(
        eval_priority=eval_priority, turnaround=0.01, grace=grace
    )
    batches = rollout_batches(host)
    assert sum(ROLLOUT not in batch for batch in batches) >= 9, batches


async def test_the_evaluation_waits_no_longer_than_the_grace_for_a_rollout_loop_that_is_away(
    autojump_clock: trio.testing.MockClock,
) -> None:
    host, answered = await batched_beside_an_evaluation(eval_priority=1, turnaround=1.0)
    alone = [(at, batch) for at, batch in host.batches if ROLLOUT not in batch]
    assert alone, "the evaluation never ran while the rollout loop was away"
    for at, _ in alone:
        last_answer = max((t for t in answered if t <= at), default=0.0)
        assert at - last_answer >= PRIORITY_GRACE - 1e-9, (at, last_answer)

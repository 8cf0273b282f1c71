"""The completion helper eval fns get on ``input.fleet``: order, concurrency, deadlines,
version checks."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from actorsys import EvalSkip, Fleet, SGLangEngine
from actorsys.fleet.clients.completions import CompletionError, StaleWeightsError, complete
from tests.fleet.conftest import Recorder


def answer(request: httpx.Request, version: str | None = "3") -> httpx.Response:
    body = json.loads(request.content)
    payload: dict[str, object] = {
        "choices": [{"index": 0, "text": body["prompt"].upper(), "finish_reason": "length"}]
    }
    if version is not None:
        payload["metadata"] = {"weight_version": version}
    return httpx.Response(200, json=payload)


async def test_answers_come_back_in_prompt_order_round_robin_over_the_targets() -> None:
    recorder = Recorder(answer)
    prompts = [f"p{i}" for i in range(6)]
    answers = await complete(
        ["http://a", "http://b/"], prompts, model="m", transport=recorder.transport
    )
    assert [a.text for a in answers] == [p.upper() for p in prompts]
    assert [a.url for a in answers] == ["http://a", "http://b"] * 3
    assert {json.loads(r.content)["model"] for r in recorder.requests} == {"m"}


async def test_no_more_than_concurrency_requests_are_in_flight(
    autojump_clock: trio.testing.MockClock,
) -> None:
    in_flight = 0
    peak = 0

    async def slow(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await trio.sleep(1)
        in_flight -= 1
        return answer(request)

    recorder = Recorder(slow)
    answers = await complete(
        ["http://a"], [str(i) for i in range(10)], model="m", concurrency=3,
        transport=recorder.transport,
    )
    assert len(answers) == 10
    assert peak == 3


async def test_a_request_without_answer_fails_the_eval_as_unhealthy_after_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def one_hangs(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["prompt"] == "hang":
            await trio.sleep_forever()
        return answer(request)

    recorder = Recorder(one_hangs)
    started = trio.current_time()
    with pytest.raises(CompletionError, match="no answer within 5.0 s") as caught:
        await complete(
            ["http://a"], ["x", "hang", "y"], model="m", request_timeout=5.0,
            transport=recorder.transport,
        )
    assert trio.current_time() - started == pytest.approx(5.0)
    assert isinstance(caught.value, EvalSkip)
    assert caught.value.reason == "unhealthy"
    assert caught.value.index == 1


async def test_an_answer_from_other_weights_is_a_pin_violation() -> None:
    recorder = Recorder(lambda request: answer(request, version="2"))
    with pytest.raises(StaleWeightsError) as caught:
        await complete(
            ["http://a"], ["x"], model="m", expected_version="3", transport=recorder.transport
        )
    assert caught.value.reason == "pin_violation"
    assert (caught.value.expected, caught.value.actual) == ("3", "2")


async def test_engines_that_report_no_version_are_not_held_to_one() -> None:
    recorder = Recorder(lambda request: answer(request, version=None))
    answers = await complete(
        ["http://a"], ["x"], model="m", expected_version="3", transport=recorder.transport
    )
    assert answers[0].weight_version is None


async def test_the_model_defaults_to_the_one_the_server_lists() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "served-model"}]})
        return answer(request)

    recorder = Recorder(handler)
    await complete(["http://router"], ["x"], transport=recorder.transport)
    assert recorder.paths() == ["GET /v1/models", "POST /v1/completions"]
    assert json.loads(recorder.requests[1].content)["model"] == "served-model"


async def test_error_status_fails_with_the_servers_message() -> None:
    recorder = Recorder(lambda request: httpx.Response(503, text="no available workers"))
    with pytest.raises(CompletionError, match="HTTP 503: no available workers"):
        await complete(["http://a"], ["x"], model="m", transport=recorder.transport)


def test_fleet_exposes_the_router_or_its_engines_urls() -> None:
    engines = [SGLangEngine("http://a:1"), SGLangEngine("http://b:2")]
    assert Fleet(engines).urls == ["http://a:1", "http://b:2"]
    assert Fleet(engines).base_url is None
    assert Fleet(engines, router_url="http://r:9/").base_url == "http://r:9"
    assert Fleet(engines[:1]).base_url == "http://a:1"


async def test_a_failed_request_is_retried_on_the_next_target(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def a_is_down(request: httpx.Request) -> httpx.Response:
        if request.url.host == "a":
            raise httpx.ConnectError("refused")
        return answer(request)

    recorder = Recorder(a_is_down)
    answers = await complete(
        ["http://a", "http://b"], ["x", "y"], model="m", retries=1, transport=recorder.transport
    )
    assert [a.url for a in answers] == ["http://b", "http://b"]
    assert [r.url.host for r in recorder.requests].count("a") == 1


async def test_kept_failures_come_back_with_their_error_after_the_retries(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def fails(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["prompt"] == "bad":
            return httpx.Response(500, text="boom")
        return answer(request)

    recorder = Recorder(fails)
    good, bad = await complete(
        ["http://a"], ["ok", "bad"], model="m", retries=2, keep_failures=True,
        transport=recorder.transport,
    )
    assert (good.text, good.error) == ("OK", None)
    assert bad.text == "" and bad.error is not None and "HTTP 500: boom" in bad.error
    assert len(recorder.requests) == 1 + 3


async def test_a_refused_request_is_not_retried() -> None:
    recorder = Recorder(lambda request: httpx.Response(400, text="prompt too long"))
    (refused,) = await complete(
        ["http://a"], ["x"], model="m", retries=3, keep_failures=True, transport=recorder.transport
    )
    assert refused.error is not None and "HTTP 400" in refused.error
    assert len(recorder.requests) == 1


async def test_a_stale_answer_fails_the_call_even_when_failures_are_kept() -> None:
    recorder = Recorder(lambda request: answer(request, version="2"))
    with pytest.raises(StaleWeightsError):
        await complete(
            ["http://a"], ["x"], model="m", expected_version="3", retries=2, keep_failures=True,
            transport=recorder.transport,
        )
    assert len(recorder.requests) == 1


async def test_completion_tokens_come_from_the_usage() -> None:
    def with_usage(request: httpx.Request) -> httpx.Response:
        response = answer(request)
        payload = json.loads(response.content)
        payload["usage"] = {"completion_tokens": 7}
        return httpx.Response(200, json=payload)

    (one,) = await complete(["http://a"], ["x"], model="m", transport=Recorder(with_usage).transport)
    assert one.completion_tokens == 7

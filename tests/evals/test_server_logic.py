"""ServerEvalFn's own logic against scripted HTTP answers (no network): readiness, flavor,
the pin deadline, refusals. Every timing is on the autojump clock."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import pytest
import trio

from actorsys import ConfigError, EvalSkip, RolloutFnEvalInput
from actorsys.evals import EvalDataset, ServerEvalFn
from actorsys.evals.harnesses.server import ServerClient
from actorsys.fleet import CheckpointRejectedError, SGLangEngine, VLLMEngine
from tests.fleet.conftest import Handler, Recorder

DATA = EvalDataset(name="d", records=({"prompt": "p", "label": "x"},))


class Scripted(ServerEvalFn):
    """A ServerEvalFn whose clients talk to ``recorder`` instead of the network. The weight
    probe is off: these servers script no snapshot to compare with (the probe has tests of
    its own, and through ServerEvalFn against a real engine)."""

    def __init__(self, handler: Handler, **kwargs: object) -> None:
        kwargs.setdefault("probe", False)
        super().__init__(DATA, url="http://server:1", **kwargs)  # type: ignore[arg-type]
        self.recorder = Recorder(handler)

    def make_engine(self, flavor: Literal["vllm", "sglang"], url: str) -> ServerClient:
        cls = VLLMEngine if flavor == "vllm" else SGLangEngine
        return cls(url, request_timeout=self.request_timeout, transport=self.recorder.transport)


def point(step: int = 3) -> RolloutFnEvalInput:
    return RolloutFnEvalInput(rollout_id=step, hf_dir="/ckpt")


def sglang_server(*, version_after_load: str | None = None, load_status: int = 200) -> Handler:
    served = {"version": "default"}

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(200)
        if path == "/model_info":
            return httpx.Response(200, json={"weight_version": served["version"]})
        if path == "/update_weights_from_disk":
            if load_status != 200:
                return httpx.Response(load_status, json={"success": False, "message": "bad ckpt"})
            body = json.loads(request.content)
            served["version"] = version_after_load or body["weight_version"]
            return httpx.Response(200, json={"success": True})
        return httpx.Response(404)

    return handle


async def test_a_server_that_never_serves_the_version_is_a_pin_violation_at_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    evaluation = Scripted(sglang_server(version_after_load="default"), flavor="sglang",
                          pin_timeout=60.0)
    started = trio.current_time()
    with pytest.raises(EvalSkip) as caught:
        await evaluation.evaluate_checkpoint("/ckpt", point())
    assert caught.value.reason == "pin_violation"
    assert "did not serve version '3' within 60.0 s: it serves version 'default'" in str(caught.value)
    assert trio.current_time() - started == pytest.approx(60.0, abs=1.0)
    loads = [p for p in evaluation.recorder.paths() if p == "POST /update_weights_from_disk"]
    assert len(loads) > 3


async def test_connection_errors_and_5xx_during_the_pin_are_retried_until_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def restarting(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/update_weights_from_disk":
            if len(restarting.calls) % 2:  # type: ignore[attr-defined]
                restarting.calls.append(1)  # type: ignore[attr-defined]
                raise httpx.ConnectError("refused")
            restarting.calls.append(1)  # type: ignore[attr-defined]
            return httpx.Response(503, text="restarting")
        return sglang_server()(request)

    restarting.calls = []  # type: ignore[attr-defined]
    evaluation = Scripted(restarting, flavor="sglang", pin_timeout=30.0)
    with pytest.raises(EvalSkip) as caught:
        await evaluation.evaluate_checkpoint("/ckpt", point())
    assert caught.value.reason == "pin_violation"
    assert len(restarting.calls) > 5  # type: ignore[attr-defined]


async def test_a_refused_checkpoint_skips_with_the_engines_reason_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    evaluation = Scripted(sglang_server(load_status=400), flavor="sglang")
    started = trio.current_time()
    with pytest.raises(EvalSkip) as caught:
        await evaluation.evaluate_checkpoint("/ckpt", point())
    assert caught.value.reason == CheckpointRejectedError.reason
    assert trio.current_time() - started == 0
    assert "bad ckpt" in str(caught.value)


async def test_a_server_not_ready_within_ready_timeout_is_unhealthy_and_waits_no_longer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    evaluation = Scripted(down, ready_timeout=100.0)
    started = trio.current_time()
    with pytest.raises(EvalSkip, match="not ready within 100.0 s") as caught:
        await evaluation.evaluate_checkpoint("/ckpt", point())
    assert caught.value.reason == "unhealthy"
    assert trio.current_time() - started == pytest.approx(100.0)
    with pytest.raises(EvalSkip, match="not ready"):
        await evaluation.evaluate_checkpoint("/ckpt", point(4))
    assert trio.current_time() - started == pytest.approx(100.0)


async def test_construction_waits_for_nothing_and_readiness_comes_at_the_first_evaluation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    evaluation = Scripted(sglang_server(version_after_load="default"), pin_timeout=1.0)
    assert evaluation.recorder.requests == []
    with pytest.raises(EvalSkip):
        await evaluation.evaluate_checkpoint("/ckpt", point())
    assert evaluation.recorder.paths()[:2] == ["GET /health", "GET /model_info"]


async def test_auto_flavor_finds_a_vllm_server_by_its_weight_info() -> None:
    def vllm(request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/health",):
            return httpx.Response(200)
        if request.url.path == "/weight_info":
            return httpx.Response(200, json={"weight_version": "default"})
        return httpx.Response(404)

    evaluation = Scripted(vllm)
    engine = await evaluation.server.detect()
    assert isinstance(engine, VLLMEngine)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "pass exactly one"),
        ({"url": "http://a", "launch": ["x", "{port}"]}, "pass exactly one"),
        ({"url": "ftp://a"}, "http:// or https://"),
        ({"launch": "vllm serve"}, "argv list"),
        ({"launch": ["server", "--port", "8000"]}, "must contain '{port}'"),
        ({"url": "http://a", "flavor": "tgi"}, "flavor"),
        ({"url": "http://a", "ready_timeout": 0}, "ready_timeout"),
        ({"url": "http://a", "concurrency": 0}, "concurrency"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs: dict, message: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=message):
        ServerEvalFn(DATA, **kwargs)

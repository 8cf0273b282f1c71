"""The engine clients' own logic against fake HTTP: endpoints, bodies, retries, deadlines."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
import trio

from actorsys import SGLangEngine, VLLMEngine
from actorsys.fleet import CheckpointRejectedError, EngineUnhealthyError
from tests.fleet.conftest import Recorder, TinyModels, corrupt_copy


def ok(body: object = None) -> httpx.Response:
    return httpx.Response(200, json={} if body is None else body)


def sglang(recorder: Recorder, **kwargs: object) -> SGLangEngine:
    return SGLangEngine("http://engine:30000", transport=recorder.transport, **kwargs)  # type: ignore[arg-type]


# -- sglang ----------------------------------------------------------------------------------


async def test_sglang_load_labels_the_version_and_never_aborts_requests() -> None:
    recorder = Recorder(lambda request: ok({"success": True, "message": "ok"}))
    await sglang(recorder).load_weights("/ckpt/step_3", "3")
    assert recorder.paths() == ["POST /update_weights_from_disk"]
    body = json.loads(recorder.requests[0].content)
    assert body == {
        "model_path": "/ckpt/step_3",
        "weight_version": "3",
        "flush_cache": True,
        "abort_all_requests": False,
    }


async def test_sglang_refused_load_is_a_rejected_checkpoint_with_the_servers_reason() -> None:
    recorder = Recorder(
        lambda request: httpx.Response(400, json={"success": False, "message": "shape mismatch"})
    )
    with pytest.raises(CheckpointRejectedError, match="shape mismatch") as caught:
        await sglang(recorder).load_weights("/ckpt/step_3", "3")
    assert caught.value.reason == "ckpt_invalid"
    assert caught.value.path == "/ckpt/step_3"


async def test_sglang_version_endpoint_is_probed_once_and_404_means_unsupported() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/get_weight_version":
            return ok({"weight_version": "7"})
        return httpx.Response(404)

    recorder = Recorder(handler)
    engine = sglang(recorder)
    assert await engine.weight_version() == "7"
    assert recorder.paths() == ["GET /model_info", "GET /get_model_info", "GET /get_weight_version"]
    assert await engine.weight_version() == "7"
    assert recorder.paths()[3:] == ["GET /get_weight_version"]


async def test_sglang_without_any_version_endpoint_is_unhealthy() -> None:
    recorder = Recorder(lambda request: httpx.Response(404))
    with pytest.raises(EngineUnhealthyError, match="reports no weight version"):
        await sglang(recorder).weight_version()


async def test_sglang_load_retries_connection_errors_and_5xx_while_the_server_reloads(
    autojump_clock: trio.testing.MockClock,
) -> None:
    answers: list[object] = [
        httpx.ConnectError("refused"),
        httpx.Response(503, text="reloading"),
        httpx.ReadTimeout("slow"),
        ok({"success": True}),
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, httpx.Response)
        return answer

    recorder = Recorder(handler)
    await sglang(recorder).load_weights("/ckpt/step_1", "1")
    assert len(recorder.requests) == 4
    assert not answers


async def test_sglang_load_retries_until_the_callers_deadline_and_no_longer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    recorder = Recorder(lambda request: httpx.Response(503, text="reloading"))
    started = trio.current_time()
    with trio.move_on_after(60) as deadline:
        await sglang(recorder).load_weights("/ckpt/step_1", "1")
    assert deadline.cancelled_caught
    assert trio.current_time() - started == pytest.approx(60)
    assert len(recorder.requests) > 10


async def test_health_check_refused_connection_is_unhealthy_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    recorder = Recorder(refuse)
    with pytest.raises(EngineUnhealthyError, match="connection refused"):
        await sglang(recorder).health()
    assert len(recorder.requests) == 1


async def test_health_check_that_gets_no_answer_is_retried_until_the_callers_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    recorder = Recorder(hang)
    engine = sglang(recorder, request_timeout=2.0)
    with trio.move_on_after(10) as deadline:
        with pytest.raises(httpx.ReadTimeout):
            await engine._send("GET", "/health", seconds=2.0)
        await engine.health()
    assert deadline.cancelled_caught
    assert len(recorder.requests) >= 3


async def test_health_generate_falls_back_to_health_when_the_server_lacks_it() -> None:
    recorder = Recorder(
        lambda request: httpx.Response(404) if request.url.path == "/health_generate" else ok()
    )
    await sglang(recorder, health_generate=True).health()
    assert recorder.paths() == ["GET /health_generate", "GET /health"]


async def test_api_key_is_sent_as_a_bearer_token_on_every_request() -> None:
    recorder = Recorder(lambda request: ok({"weight_version": "1", "success": True}))
    engine = sglang(recorder, api_key="s3cret")
    await engine.health()
    await engine.load_weights("/ckpt", "1")
    await engine.weight_version()
    assert {r.headers["authorization"] for r in recorder.requests} == {"Bearer s3cret"}


@pytest.mark.timeout(10)
async def test_cancelled_request_closes_its_connection() -> None:
    got_request = trio.Event()
    closed = trio.Event()

    async def serve(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        got_request.set()
        while await stream.receive_some(65536):
            pass
        closed.set()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, serve, 0)
        port = listeners[0].socket.getsockname()[1]
        engine = SGLangEngine(f"http://127.0.0.1:{port}")
        with trio.CancelScope() as scope:
            nursery.start_soon(_cancel_when_set, got_request, scope)
            await engine.health()
        with trio.fail_after(5):
            await closed.wait()
        nursery.cancel_scope.cancel()


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def test_bad_url_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"SGLangEngine\(url\)"):
        SGLangEngine("localhost:30000")
    with pytest.raises(ValueError, match=r"VLLMEngine\(request_timeout\)"):
        VLLMEngine("http://localhost:8000", request_timeout=0)


# -- vLLM ------------------------------------------------------------------------------------


def vllm_server(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/weight_info":
        return ok({"weight_version": "default"})
    return ok({"status": "ok"})


def vllm(recorder: Recorder, tiny: TinyModels) -> VLLMEngine:
    return VLLMEngine(
        "http://vllm:8000", served_model_dir=str(tiny.base), transport=recorder.transport
    )


async def test_vllm_pin_pauses_waiting_reloads_labels_and_resumes_in_order(
    tiny: TinyModels,
) -> None:
    recorder = Recorder(vllm_server)
    engine = vllm(recorder, tiny)
    await engine.load_weights(str(tiny.step1), "1")
    assert recorder.paths() == [
        "POST /pause", "POST /collective_rpc", "POST /update_weight_version", "POST /resume",
    ]
    pause, reload, label, _ = recorder.requests
    assert pause.url.params["mode"] == "wait"
    assert json.loads(reload.content) == {
        "method": "reload_weights", "kwargs": {"weights_path": str(tiny.step1)},
    }
    assert json.loads(label.content) == {"new_version": "1"}


@pytest.mark.parametrize("problem", ["missing", "corrupt", "other_arch", "incomplete"])
async def test_vllm_never_sees_a_checkpoint_that_would_kill_it(
    tiny: TinyModels, tmp_path: Path, problem: str
) -> None:
    if problem == "missing":
        path = tmp_path / "nothing"
    elif problem == "corrupt":
        path = corrupt_copy(tiny.step1, tmp_path / "corrupt")
    elif problem == "other_arch":
        path = tiny.other_arch
    else:
        path = tmp_path / "incomplete"
        shutil.copytree(tiny.step1, path)
        (path / ".complete").unlink()
    recorder = Recorder(vllm_server)
    engine = VLLMEngine(
        "http://vllm:8000",
        served_model_dir=str(tiny.base),
        require_complete=True,
        transport=recorder.transport,
    )
    with pytest.raises(CheckpointRejectedError) as caught:
        await engine.load_weights(str(path), "1")
    assert caught.value.reason == "ckpt_invalid"
    assert recorder.requests == []


async def test_vllm_finds_the_served_model_through_v1_models(tiny: TinyModels) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return ok({"data": [{"id": "tiny", "root": str(tiny.base)}]})
        return vllm_server(request)

    recorder = Recorder(handler)
    engine = VLLMEngine("http://vllm:8000", transport=recorder.transport)
    with pytest.raises(CheckpointRejectedError, match="architecture differs"):
        await engine.load_weights(str(tiny.other_arch), "1")
    assert recorder.paths() == ["GET /v1/models"]


async def test_vllm_failed_reload_is_unhealthy_and_the_server_is_resumed(tiny: TinyModels) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/collective_rpc":
            return httpx.Response(500, text="reload failed")
        return vllm_server(request)

    recorder = Recorder(handler)
    engine = vllm(recorder, tiny)
    with pytest.raises(EngineUnhealthyError, match="reload failed"):
        await engine.load_weights(str(tiny.step1), "1")
    assert recorder.paths() == ["POST /pause", "POST /collective_rpc", "POST /resume"]


async def test_vllm_load_cancelled_during_the_reload_still_resumes_the_server(
    tiny: TinyModels,
) -> None:
    reloading = trio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/collective_rpc":
            reloading.set()
            await trio.sleep_forever()
        return vllm_server(request)

    recorder = Recorder(handler)
    engine = vllm(recorder, tiny)
    async with trio.open_nursery() as nursery:
        with trio.CancelScope() as scope:
            nursery.start_soon(_cancel_when_set, reloading, scope)
            await engine.load_weights(str(tiny.step1), "1")
    assert scope.cancelled_caught
    assert recorder.paths() == ["POST /pause", "POST /collective_rpc", "POST /resume"]


async def test_vllm_version_comes_from_weight_info_and_needs_dev_mode() -> None:
    recorder = Recorder(vllm_server)
    engine = VLLMEngine("http://vllm:8000", transport=recorder.transport)
    assert await engine.weight_version() == "default"
    missing = Recorder(lambda request: httpx.Response(404))
    with pytest.raises(EngineUnhealthyError, match="VLLM_SERVER_DEV_MODE=1"):
        await VLLMEngine("http://vllm:8000", transport=missing.transport).weight_version()

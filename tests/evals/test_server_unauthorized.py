"""A server that refuses our key (HTTP 401 or 403) skips the point at once, ``unhealthy`` with
its message, instead of looking like a server that is not ready yet for ``ready_timeout``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import trio

from actorsys import EvalConfig, EvalSupervisor, MemorySink
from actorsys.evals import EvalDataset, ServerEvalFn
from actorsys.fleet import EngineUnauthorizedError, SGLangEngine
from tests.fleet.conftest import TinyModels


def refusing(status: int) -> type[BaseHTTPRequestHandler]:
    class Refuses(BaseHTTPRequestHandler):
        """A server guarded by a key we do not have: ``/health`` answers, nothing else."""

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            code, body = (200, {}) if self.path == "/health" else (status, {"error": "invalid key"})
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    return Refuses


@pytest.fixture(params=[401, 403])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), refusing(request.param))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", request.param
    finally:
        httpd.shutdown()
        httpd.server_close()


def dataset(tmp_path: Path) -> EvalDataset:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "one two", "label": "three"}) + "\n")
    return EvalDataset.from_jsonl(path)


@pytest.mark.timeout(60)
async def test_a_server_refusing_our_key_skips_the_point_within_seconds_with_its_message(
    server: tuple[str, int], tiny: TinyModels, tmp_path: Path
) -> None:
    url, status = server
    eval_fn = ServerEvalFn(dataset(tmp_path), url=url, api_key="wrong", ready_timeout=1800.0)
    sink = MemorySink()
    config = EvalConfig(hf_dir=tmp_path / "staging", pin_timeout=600.0, close_timeout=10.0)
    started = time.monotonic()
    async with EvalSupervisor.open(config, eval_fn=eval_fn, sink=sink) as sup:
        await sup.submit(1, checkpoint_dir=tiny.step1)
        await sup.drain(timeout=60)
    assert time.monotonic() - started < 20
    outcome = sink.by_step()[1]
    assert (outcome.status, outcome.reason) == ("skipped", "unhealthy")
    assert f"HTTP {status}" in outcome.data["error"] and "invalid key" in outcome.data["error"]
    assert "wrong API key" in outcome.data["error"]


@pytest.mark.timeout(60)
async def test_a_pin_to_a_server_refusing_our_key_is_unhealthy_at_once(
    server: tuple[str, int], tiny: TinyModels
) -> None:
    url, status = server
    engine = SGLangEngine(url, api_key=None)
    with trio.fail_after(20), pytest.raises(EngineUnauthorizedError) as caught:
        await engine.load_weights(str(tiny.step1), "1")
    assert caught.value.reason == "unhealthy" and "no API key" in str(caught.value)

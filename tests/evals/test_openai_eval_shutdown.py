"""An OpenAIEvalFn cut while its client holds a connection shuts its loop down cleanly and in
bounded time: a client that takes the cancellation is closed (its ``async with`` exit ran
whole), one that ignores it is closed after ``shutdown_grace``, and neither leaves a task to
be collected after its loop closed (which fails with "Event loop is closed", an unraisable
exception: an error here). The OpenAI SDK against a loopback server that answers at once."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import trio

from actorsys import RolloutFnEvalInput, RolloutFnEvalOutput
from actorsys.evals import OpenAIEvalFn

pytest.importorskip("openai")

pytestmark = [
    pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.timeout(60),
]

ANSWER = {
    "id": "c", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "4"}}],
}


class Answering(BaseHTTPRequestHandler):
    """An OpenAI-compatible server that answers every chat request at once (keep-alive)."""

    protocol_version = "HTTP/1.1"

    def _send(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - the handler's name
        self._send({"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self) -> None:  # noqa: N802 - the handler's name
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self._send(ANSWER)

    def log_message(self, *args: object) -> None:
        pass


class Fleet:
    def __init__(self, url: str) -> None:
        self.urls = [url]
        self.version = None
        self.api_key = None


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answering)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Fleet(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


class Waits(OpenAIEvalFn):
    """Asks once (the connection stays open in the client's pool), then waits until cut and
    cleans up for a few turns of its loop; ``stubborn``: ignores every cancellation."""

    shutdown_grace = 0.5

    def __init__(self, *, stubborn: bool) -> None:
        self.stubborn = stubborn
        self.asked = threading.Event()
        self.cleaned_up = threading.Event()
        self.clients: list[Any] = []

    async def evaluate_with_client(
        self, client: Any, model: str, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        self.clients.append(client)
        await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "2+2?"}])
        self.asked.set()
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if not self.stubborn:
                    await asyncio.sleep(0.05)  # a clean-up that takes a few turns of the loop
                    self.cleaned_up.set()
                    raise


async def cut_after_the_answer(fn: Waits, fleet: Fleet) -> None:
    """Run one evaluation of ``fn`` and cut it once its first answer came."""
    async with trio.open_nursery() as nursery:

        async def evaluate() -> None:
            await fn.evaluate_checkpoint("/ckpt", RolloutFnEvalInput(1, "1", "/ckpt", fleet))

        nursery.start_soon(evaluate)
        with trio.fail_after(30):
            while not fn.asked.is_set():  # noqa: ASYNC110 - set in the client's thread
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


async def loops_end(fn: Waits) -> None:
    with trio.fail_after(10):
        while fn.statistics()["loops"]:  # noqa: ASYNC110 - a thread's end signals nothing else
            await trio.sleep(0.02)


async def test_a_cut_client_finishes_its_clean_up_and_is_closed_before_its_loop_closes(fleet: Fleet) -> None:
    fn = Waits(stubborn=False)
    await cut_after_the_answer(fn, fleet)
    await loops_end(fn)
    assert fn.cleaned_up.is_set()
    assert fn.clients[0].is_closed()
    del fn
    gc.collect()


async def test_a_client_ignoring_its_cancellation_is_closed_after_the_grace_without_a_closed_loop_error(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    gc.collect()  # what earlier tests of this worker left (lm-eval's tasks) logs now, not below
    caplog.clear()
    fn = Waits(stubborn=True)
    cut = trio.current_time()
    await cut_after_the_answer(fn, fleet)
    await loops_end(fn)
    assert trio.current_time() - cut >= Waits.shutdown_grace
    del fn
    gc.collect()
    assert "ignored its cancellation" in caplog.text
    assert "destroyed but it is pending" not in caplog.text
    assert "never retrieved" not in caplog.text

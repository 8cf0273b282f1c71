"""The ways an evaluation can hang, each as a real eval fn (threads, servers, processes).

Shared by the close-bound tests and ``bench/close_bound.py``. Each scenario is a context
manager yielding an eval fn whose first evaluation never returns on its own; leaving it
releases whatever is still stuck (sets events, resumes and kills processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import httpx
import trio

from actorsys import CheckpointEvalFn, RolloutFnEvalInput, RolloutFnEvalOutput

HTTP_SERVER = """
import http.server, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
class Server(http.server.HTTPServer):
    def handle_error(self, request, client_address):
        pass
server = Server(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""

IGNORES_SIGTERM = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
while True:
    time.sleep(3600)
"""


class Hang(CheckpointEvalFn):
    """An eval fn that sets ``entered`` once its evaluation is under way (and stuck)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()


class TrioForever(Hang):
    """A trio eval fn awaiting something that never happens."""

    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:  # noqa: A002
        self.entered.set()
        await trio.sleep_forever()


class ThreadBlocked(Hang):
    """A plain eval fn stuck in a blocking call in its worker thread."""

    runtime = "thread"

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:  # noqa: A002
        self.entered.set()
        self.release.wait()
        return RolloutFnEvalOutput()


class AsyncioForever(Hang):
    """An asyncio eval fn awaiting forever on its private loop."""

    runtime = "asyncio"

    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:  # noqa: A002
        self.entered.set()
        await asyncio.Event().wait()


class HttpEngineCall(Hang):
    """A trio eval fn asking an HTTP engine for its result, with no client timeout."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url

    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:  # noqa: A002
        self.entered.set()
        async with httpx.AsyncClient(timeout=None) as client:
            response = await client.get(self.url)
        return RolloutFnEvalOutput(data=response.json())


class SubprocessIgnoringTerm(Hang):
    """A trio eval fn waiting on a subprocess that ignores SIGTERM (trio's ``run_process``
    answers cancellation with SIGTERM, then SIGKILL 5 s later)."""

    def __init__(self) -> None:
        super().__init__()
        self.pids: list[int] = []

    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:  # noqa: A002
        async with trio.open_nursery() as nursery:
            command = [sys.executable, "-c", IGNORES_SIGTERM]
            run = partial(trio.run_process, command, stdout=subprocess.PIPE)
            process = await nursery.start(run)
            self.pids.append(process.pid)
            await process.stdout.receive_some()  # "ready": SIGTERM is ignored from here on
            self.entered.set()


class WedgesTrio(Hang):
    """A 'trio' eval fn that blocks the whole trio thread (a sync call in an async def)."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:  # noqa: A002
        self.entered.set()
        self.release.wait()  # noqa: ASYNC101 - the point: a blocking call wedging the loop
        return RolloutFnEvalOutput()


@contextlib.contextmanager
def trio_forever() -> Iterator[Hang]:
    yield TrioForever()


@contextlib.contextmanager
def thread_blocked() -> Iterator[Hang]:
    release = threading.Event()
    try:
        yield ThreadBlocked(release)
    finally:
        release.set()


@contextlib.contextmanager
def asyncio_forever() -> Iterator[Hang]:
    yield AsyncioForever()


@contextlib.contextmanager
def http_engine_stopped() -> Iterator[Hang]:
    """A real HTTP server on loopback, answered once, then stopped with SIGSTOP."""
    server = subprocess.Popen(
        [sys.executable, "-c", HTTP_SERVER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}/score"
        assert httpx.get(url, timeout=10).json() == {"ok": True}
        server.send_signal(signal.SIGSTOP)
        yield HttpEngineCall(url)
    finally:
        server.send_signal(signal.SIGCONT)
        server.kill()
        server.wait()


@contextlib.contextmanager
def subprocess_ignoring_term() -> Iterator[Hang]:
    eval_fn = SubprocessIgnoringTerm()
    try:
        yield eval_fn
    finally:
        for pid in eval_fn.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def trio_thread_wedged() -> Iterator[Hang]:
    release = threading.Event()
    try:
        yield WedgesTrio(release)
    finally:
        release.set()


SCENARIOS: dict[str, Callable[[], contextlib.AbstractContextManager[Hang]]] = {
    "trio_eval_never_returns": trio_forever,
    "thread_stuck_in_blocking_call": thread_blocked,
    "http_engine_sigstopped": http_engine_stopped,
    "asyncio_eval_awaits_forever": asyncio_forever,
    "subprocess_ignores_sigterm": subprocess_ignoring_term,
    "trio_thread_wedged": trio_thread_wedged,
}

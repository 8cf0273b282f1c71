"""A real vLLM server that the tests of the vLLM lane share: started once, the first time a test
asks for it, and stopped as soon as the next test does not (tests/conftest.py), so that the tests that only
need "a vLLM serving snapshots of this model" do not each pay a start (~30 CPU seconds).

It is started exactly as a local fleet starts one (:func:`actorsys.fleet.local.vllm`'s command
line and environment, the key in ``VLLM_API_KEY``, on a socket bound here and inherited), with
one difference that the tests about starting never see (they start their own): vLLM's engine
runs its model in its engine-core process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) instead of a
worker process of its own, one interpreter less to start. The worker extension, the reload and
every HTTP route are the same. The fixture is synchronous (pytest-trio has no session-scoped
async fixtures): a subprocess and a bounded wait for ``/health``.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import httpx

from actorsys import Fleet, VLLMEngine
from actorsys.fleet.clients.vllm import TIED_RELOAD
from actorsys.fleet.local import vllm
from tests.engine_process import wait_healthy
from tests.fleet.conftest import VLLM_PYTHON

START_SECONDS = 400.0
STOP_SECONDS = 30.0
IN_PROCESS_ENGINE = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@dataclass(frozen=True)
class SharedVLLM:
    """A running vLLM server serving ``model_dir``, its URL and the key it requires."""

    model_dir: Path
    url: str
    api_key: str
    process: subprocess.Popen[bytes]
    log: Path

    def fleet(self, *, reload_method: str = TIED_RELOAD) -> Fleet:
        """A fleet of this one server, its client as a local fleet's (reloading through the
        worker extension unless ``reload_method`` says otherwise)."""
        return Fleet([VLLMEngine(self.url, name="shared-vllm", api_key=self.api_key,
                                 served_model_dir=str(self.model_dir),
                                 reload_method=reload_method)])


def start(model_dir: Path) -> SharedVLLM:
    """Start vLLM on ``model_dir`` and wait, bounded, until its ``/health`` answers."""
    spec = vllm(str(model_dir), python=str(VLLM_PYTHON))
    api_key = secrets.token_urlsafe(16)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    assert spec.listen is not None
    command = spec.listen(spec.command(port), listener.fileno())
    env = {**spec.environment(api_key), **IN_PROCESS_ENGINE}
    fd, log = tempfile.mkstemp(prefix="shared-vllm-", suffix=".log")
    try:
        process = subprocess.Popen(command, env=env, pass_fds=(listener.fileno(),),
                                   stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    finally:
        listener.close()
        os.close(fd)
    server = SharedVLLM(model_dir, f"http://127.0.0.1:{port}", api_key, process, Path(log))
    try:
        deadline = time.monotonic() + START_SECONDS
        with httpx.Client(timeout=5.0) as client:
            wait_healthy(client, process, server.url, deadline, what="vLLM", log=server.log, pause=0.2)
        return server
    except BaseException:
        stop(server)
        raise


def stop(server: SharedVLLM) -> None:
    """SIGTERM to the server's process group, SIGKILL after :data:`STOP_SECONDS`."""
    process = server.process
    for sig, wait in ((signal.SIGTERM, STOP_SECONDS), (signal.SIGKILL, STOP_SECONDS)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(process.pid, signal.SIGKILL)  # what the API server left of its group
    except ProcessLookupError:
        pass
    server.log.unlink(missing_ok=True)


class SharedServers:
    """The lane's shared servers, one per fixture that asks for one, each started on first use
    and stopped once the next test does not ask for that fixture. Keyed by the fixture, not the
    model's directory: ``tests/evals`` re-exports the tiny-model fixtures, so pytest builds the
    same models (same seeds) once per directory, and the servers' tests pin snapshots before
    they ask anything, so one server serves both copies."""

    def __init__(self) -> None:
        self.running: dict[str, SharedVLLM] = {}

    def get(self, model_dir: Path, fixture: str) -> SharedVLLM:
        server = self.running.get(fixture)
        if server is not None:
            if server.process.poll() is None:
                return server
            tail = server.log.read_bytes()[-2000:].decode(errors="replace")
            warnings.warn(f"the shared vLLM on {server.model_dir} exited "
                          f"({server.process.returncode}); starting another. Its log ends: {tail}",
                          stacklevel=2)
            stop(self.running.pop(fixture))
        server = self.running[fixture] = start(model_dir)
        return server

    def keep_only(self, fixtures: Collection[str]) -> None:
        """Stop every server whose fixture is not in ``fixtures``."""
        for fixture in [f for f in self.running if f not in fixtures]:
            stop(self.running.pop(fixture))


SERVERS = SharedServers()
"""This process's shared servers (each xdist worker has its own; the lane runs on one)."""

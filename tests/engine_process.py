"""Real CPU engine processes (``python -m actorsys engine``) on loopback, for a test module to
share: started, waited for until their ``/health`` answers, terminated after.

Each serves a listening socket bound here first (``--listen-fd``, as :class:`LocalFleet`
starts them): the kernel picks the port and it is held from the bind on, so two test workers
starting engines at once never collide on one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from actorsys.fleet._proc.port import held_listener

START_SECONDS = 120.0


@contextmanager
def engine_processes(
    argvs: Sequence[Sequence[str]],
    *,
    key: str | None = None,
    logs: Sequence[Path] | None = None,
    processes: list[subprocess.Popen[bytes]] | None = None,
) -> Iterator[list[str]]:
    """Serve one ``engine`` per entry of ``argvs`` (``--model`` and the rest; the socket is
    bound here), all with the key ``key`` (from the environment, as the fleets hand it),
    started at once; yields their URLs. Each engine's output goes to its entry of ``logs``
    (if given; else nowhere); their processes are added to ``processes`` (if given). The
    wait is on real processes, so it polls the wall clock, bounded by :data:`START_SECONDS`
    for all of them."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("ACTORSYS_API_KEY", None)
    if key is not None:
        env["ACTORSYS_API_KEY"] = key
    with ExitStack() as files:
        started: list[tuple[subprocess.Popen[bytes], str]] = []
        try:
            for i, args in enumerate(argvs):
                listener = files.enter_context(held_listener())
                port = int(listener.getsockname()[1])
                command = [sys.executable, "-m", "actorsys", "engine", *args,
                           "--port", str(port), "--listen-fd", str(listener.fileno())]
                output = subprocess.DEVNULL if logs is None else files.enter_context(logs[i].open("wb"))
                process = subprocess.Popen(command, env=env, stdout=output, stderr=output,
                                           pass_fds=[listener.fileno()])
                started.append((process, f"http://127.0.0.1:{port}"))
                if processes is not None:
                    processes.append(process)
            deadline = time.monotonic() + START_SECONDS
            with httpx.Client(timeout=5.0) as client:
                for process, url in started:
                    wait_healthy(client, process, url, deadline)
            yield [url for _, url in started]
        finally:
            _stop([process for process, _ in started])


@contextmanager
def engine_process(
    args: Sequence[str],
    *,
    key: str | None = None,
    processes: list[subprocess.Popen[bytes]] | None = None,
) -> Iterator[str]:
    """One engine of :func:`engine_processes`; yields its URL."""
    with engine_processes([args], key=key, processes=processes) as (url,):
        yield url


def wait_healthy(
    client: httpx.Client,
    process: subprocess.Popen[bytes],
    url: str,
    deadline: float,
    *,
    what: str = "the engine",
    log: Path | None = None,
    pause: float = 0.1,
) -> None:
    """Poll ``url``'s ``/health`` until it answers 200. Fails when ``process`` exits first
    (with the tail of its ``log``, if given) or the wall clock passes ``deadline``: it waits on
    a real process's start, so it sleeps ``pause`` between polls."""
    while True:
        if process.poll() is not None:
            tail = "" if log is None else ": " + log.read_bytes()[-4000:].decode(errors="replace")
            raise AssertionError(f"{what} exited at start ({process.returncode}){tail}")
        assert time.monotonic() < deadline, f"{what} was not healthy before its start deadline"
        try:
            if client.get(f"{url}/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(pause)


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to all at once, then wait for each (SIGKILL past 30 s)."""
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

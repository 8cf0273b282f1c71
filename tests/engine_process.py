"""A real CPU engine process (``python -m actorsys engine``) on a free loopback port, for a
test module to share: started, waited for until its ``/health`` answers, terminated after."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import httpx

from actorsys.fleet.local import free_port

START_SECONDS = 120.0


@contextmanager
def engine_process(args: Sequence[str], *, key: str | None = None) -> Iterator[str]:
    """Serve ``engine`` with ``args`` (``--model`` and the rest; the port is chosen here) and
    the key ``key`` (from the environment, as the fleets hand it); yields its URL. The wait is
    on a real process, so it polls the wall clock, bounded by :data:`START_SECONDS`."""
    port = free_port()
    command = [sys.executable, "-m", "actorsys", "engine", *args, "--port", str(port)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("ACTORSYS_API_KEY", None)
    if key is not None:
        env["ACTORSYS_API_KEY"] = key
    process = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_SECONDS
        with httpx.Client(timeout=5.0) as client:
            while True:
                assert process.poll() is None, "the engine exited at start"
                assert time.monotonic() < deadline, f"the engine was not healthy in {START_SECONDS} s"
                try:
                    if client.get(f"{url}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)

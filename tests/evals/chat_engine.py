"""A real CPU engine process serving the tiny chat model, shared by a test module."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from actorsys import Fleet, SGLangEngine
from actorsys.fleet.local import free_port
from tests.chat_models import make_tool_chat_model


@dataclass(frozen=True)
class ChatEngine:
    """An engine at ``url`` answering to ``key``, serving ``base``; ``snapshots`` of its
    architecture and tokenizer (other weights) by step."""

    url: str
    key: str | None
    base: Path
    snapshots: dict[int, Path]

    def fleet(self) -> Fleet:
        return Fleet([SGLangEngine(self.url, api_key=self.key)])


@contextmanager
def chat_engine(root: Path, *, key: str | None, steps: tuple[int, ...] = (1, 2)) -> Iterator[ChatEngine]:
    base = make_tool_chat_model(root / "base", seed=0)
    snapshots = {step: make_tool_chat_model(root / f"step{step}", seed=step) for step in steps}
    port = free_port()
    command = [sys.executable, "-m", "actorsys", "engine", "--model", str(base), "--port", str(port)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("ACTORSYS_API_KEY", None)
    if key is not None:
        env["ACTORSYS_API_KEY"] = key
    process = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=5.0) as client:
            for _ in range(600):
                assert process.poll() is None, "the engine exited at start"
                try:
                    if client.get(f"{url}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
        yield ChatEngine(url, key, base, snapshots)
    finally:
        process.terminate()
        process.wait(timeout=30)

"""An asyncio host keeps its asyncio as it was, and the bridge's deadlines fire while the host
blocks its own loop."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hangs import SCENARIOS

from actorsys import EvalConfig, MemorySink, Outcome
from bridge import AsyncEvalBridge

HOST = Path(__file__).with_name("asyncio_host.py")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_importing_and_using_the_bridge_leaves_the_hosts_asyncio_as_it_was(
    checkpoint_dir: str,
) -> None:
    run = subprocess.run(
        [sys.executable, str(HOST), checkpoint_dir], capture_output=True, text=True, timeout=50
    )
    assert run.returncode == 0, run.stderr
    state = json.loads(run.stdout.strip().splitlines()[-1])
    assert state["after_import"] == state["before"]
    assert state["after_use"] == state["before"]
    assert state["before"]["non_daemon_threads"] == []
    assert state["used"]["inside"] == state["before"]["loop"]
    assert state["used"]["status"] == "ok"
    assert state["used"]["eval"]["thread"] == "actorsys-asyncio"
    assert state["used"]["clean"]


class SettledSignal(MemorySink):
    """Sets ``settled`` from the supervisor's thread when a point settles."""

    def __init__(self) -> None:
        super().__init__()
        self.settled = threading.Event()

    def record(self, outcome: Outcome) -> None:
        super().record(outcome)
        self.settled.set()


@pytest.mark.timeout(30)
def test_eval_deadline_fires_while_the_host_blocks_its_loop(checkpoint_dir: str) -> None:
    sink = SettledSignal()

    async def host() -> bool:
        with SCENARIOS["asyncio_eval_awaits_forever"]() as eval_fn:
            config = EvalConfig(eval_timeout=0.5)
            async with AsyncEvalBridge(config, eval_fn=eval_fn, sink=sink) as bridge:
                assert await bridge.submit(1, checkpoint_dir=checkpoint_dir)
                # A sync ray.get or a CUDA sync: the host's loop runs nothing until it returns.
                return sink.settled.wait(20)

    assert asyncio.run(host())
    assert [(o.step, o.reason) for o in sink.outcomes] == [(1, "timeout")]

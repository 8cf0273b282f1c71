"""weight_update from a host: EvalBridge's ``with`` and AsyncEvalBridge's ``async with`` (real
trio thread, in-process shared engine): entry waits for the served point before it, cuts a
hanging one at the budget, and a point submitted inside the block starts only after it."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from actorsys import (
    CheckpointEvalFn,
    EvalConfig,
    Fleet,
    MemorySink,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from bridge import AsyncEvalBridge, EvalBridge
from tests.core.test_shared_mode import SharedEngine


class Gated(CheckpointEvalFn):
    """A thread eval: each step waits for its gate (at most 30 s); ``started`` in order."""

    runtime = "thread"

    def __init__(self, steps: tuple[int, ...]) -> None:
        self.gates = {step: threading.Event() for step in steps}
        self.started: list[int] = []

    def evaluate_checkpoint(self, checkpoint_dir: str | None, input: RolloutFnEvalInput) -> Any:  # type: ignore[override]
        self.started.append(input.rollout_id)
        self.gates[input.rollout_id].wait(30)
        return RolloutFnEvalOutput(data={})


def wait_until(condition: Any, seconds: float = 30.0) -> None:
    """Poll a real thread's progress (the trio thread), bounded."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the bridge did not get there in time"
        time.sleep(0.01)


def test_the_sync_bridge_waits_for_the_point_before_it_and_holds_new_ones_in_the_block() -> None:
    engine = SharedEngine("rollout")
    engine.version = "1"
    eval_fn = Gated((1, 2))
    sink = MemorySink()
    config = EvalConfig(shared_update_timeout=30.0)
    with EvalBridge(config, eval_fn=eval_fn, fleet=Fleet([engine], shared=True), sink=sink) as ev:
        assert ev.submit(1, served=True)
        wait_until(lambda: eval_fn.started == [1])
        threading.Timer(0.5, eval_fn.gates[1].set).start()
        entered = time.monotonic()
        with ev.weight_update():
            assert time.monotonic() - entered >= 0.4
            assert [o.step for o in sink.outcomes] == [1]
            engine.version = "2"
            assert ev.submit(2, served=True)
            # the trio side has the point for a while, and does not start it inside the block
            assert ev.drain(timeout=0.3).pending == [2]
            assert eval_fn.started == [1]
        wait_until(lambda: eval_fn.started == [1, 2])
        eval_fn.gates[2].set()
        ev.drain(timeout=30)
        assert ev.statistics().weight_update_waits == 1
    assert [(o.step, o.status) for o in sink.outcomes] == [(1, "ok"), (2, "ok")]


def test_the_async_bridge_cuts_a_hanging_evaluation_at_the_budget() -> None:
    engine = SharedEngine("rollout")
    engine.version = "1"
    eval_fn = Gated((1,))
    sink = MemorySink()

    async def host() -> float:
        config = EvalConfig(shared_update_timeout=0.5)
        async with AsyncEvalBridge(
            config, eval_fn=eval_fn, fleet=Fleet([engine], shared=True), sink=sink
        ) as ev:
            assert await ev.submit(1, served=True)
            await asyncio.to_thread(wait_until, lambda: eval_fn.started == [1])
            entered = time.monotonic()
            async with ev.weight_update():
                took = time.monotonic() - entered
            eval_fn.gates[1].set()
            await ev.drain(timeout=30)
        return took

    took = asyncio.run(host())
    assert 0.4 <= took < 5.0
    assert [(o.step, o.reason) for o in sink.outcomes] == [(1, "preempted")]

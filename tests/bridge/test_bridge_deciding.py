"""What the supervisor decided, read from the host without waiting: protected_steps from the
moment a submit of a trainer's checkpoint returns, best(), should_stop once the host's sink has
the outcome that made it so, and due(); on EvalBridge and AsyncEvalBridge (real trio thread)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from actorsys import (
    BestPoint,
    CheckpointEvalFn,
    EvalConfig,
    Outcome,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from bridge import AsyncEvalBridge, EvalBridge


class GatedScores(CheckpointEvalFn):
    """A thread eval: step N waits for its gate, then scores ``scores[N]`` (``eval/acc``)."""

    runtime = "thread"

    def __init__(self, scores: dict[int, float]) -> None:
        self.scores = scores
        self.gates = {step: threading.Event() for step in scores}

    def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        step = int(input.rollout_id)
        assert self.gates[step].wait(30), "the test never opened the gate"
        return RolloutFnEvalOutput(data={}, metrics={"eval/acc": self.scores[step]})


class StopSeen:
    """A host sink noting, as each outcome arrives, what the bridge says of stopping."""

    def __init__(self) -> None:
        self.bridge: EvalBridge | AsyncEvalBridge | None = None
        self.seen: list[tuple[int, bool]] = []

    def record(self, outcome: Outcome) -> None:
        assert self.bridge is not None
        self.seen.append((outcome.step, self.bridge.should_stop))

    def close(self) -> None:
        pass


def checkpoints(tmp_path: Path, steps: tuple[int, ...]) -> dict[int, str]:
    paths = {}
    for step in steps:
        path = tmp_path / f"ckpt_{step}"
        path.mkdir()
        paths[step] = str(path)
    return paths


@pytest.mark.timeout(60)
def test_a_checkpoint_is_protected_once_submit_returns_until_it_settles(tmp_path: Path) -> None:
    paths = checkpoints(tmp_path, (1, 2))
    eval_fn = GatedScores({1: 0.9, 2: 0.5})
    config = EvalConfig(max_in_flight=2, best_metric="eval/acc", keep_best=1,
                        stop_when={"eval/acc": 0.8})
    sink = StopSeen()
    with EvalBridge(config, eval_fn=eval_fn, sink=sink) as bridge:
        sink.bridge = bridge
        assert bridge.protected_steps() == frozenset() and not bridge.should_stop
        assert bridge.submit(1, checkpoint_dir=paths[1])
        assert bridge.protected_steps() == {1}
        assert bridge.submit(2, checkpoint_dir=paths[2])
        assert bridge.protected_steps() == {1, 2}
        eval_fn.gates[1].set()
        eval_fn.gates[2].set()
        assert bridge.drain(timeout=30).pending == []
        assert bridge.protected_steps() == {1}  # settled, and the best
        assert bridge.best() == [BestPoint(1, 0.9, paths[1])]
        assert bridge.should_stop and "step 1" in (bridge.stop_reason or "")
    assert sink.seen == [(1, True), (2, True)]


@pytest.mark.timeout(30)
def test_due_on_the_bridge_follows_the_cadence_flags(checkpoint_dir: str) -> None:
    config = EvalConfig(eval_interval=3, skip_eval_before_train=True)
    with EvalBridge(config, eval_fn=GatedScores({})) as bridge:
        assert [step for step in range(10) if bridge.due(step)] == [3, 6, 9]


@pytest.mark.timeout(60)
def test_the_asyncio_bridge_reads_the_same_decisions(tmp_path: Path) -> None:
    paths = checkpoints(tmp_path, (1, 2, 3))
    eval_fn = GatedScores({1: 0.5, 2: 0.4, 3: 0.3})
    config = EvalConfig(best_metric="eval/acc", patience=2, eval_interval=2)

    async def main() -> None:
        async with AsyncEvalBridge(config, eval_fn=eval_fn) as bridge:
            assert bridge.due(4) and not bridge.due(3)
            for step, path in paths.items():
                assert await bridge.submit(step, checkpoint_dir=path)
                assert step in bridge.protected_steps()
                eval_fn.gates[step].set()
                await bridge.drain(timeout=30)
                assert bridge.should_stop == (step == 3)
            assert bridge.protected_steps() == frozenset()  # keep_best=0 protects no best
            assert bridge.best() == [BestPoint(1, 0.5, None)]

    asyncio.run(main())

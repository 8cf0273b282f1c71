"""Properties of the whole pipeline under random submits, stage failures, hangs and skips."""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actorsys import (
    CheckpointEvalFn,
    EvalConfig,
    EvalSkip,
    EvalSupervisor,
    Fleet,
    MemorySink,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)

EXPORTS = ("ok", "ok", "fail", "hang", "no_weights")
PINS = ("ok", "ok", "unhealthy", "violation", "hang")
EVALS = ("ok", "ok", "skip", "crash", "hang", "slow")


@dataclass(frozen=True)
class Plan:
    export: str
    pin: str
    eval: str
    gap: float
    force: bool


plans = st.builds(
    Plan,
    export=st.sampled_from(EXPORTS),
    pin=st.sampled_from(PINS),
    eval=st.sampled_from(EVALS),
    gap=st.sampled_from([0.0, 0.5, 3.0, 20.0]),
    force=st.booleans(),
)


class Staging:
    """Watches the staging dir at every moment the pipeline can grow it. (It records rather
    than asserts: an assertion inside an export or eval fn would only settle that point.)"""

    def __init__(self, path: str) -> None:
        self.path = path
        self.peak = 0

    def observe(self) -> None:
        count = sum(1 for name in os.listdir(self.path) if name.startswith(("step_", ".tmp-")))
        self.peak = max(self.peak, count)


class ScriptedEngine:
    name = "scripted"

    def __init__(self, plans: dict[int, Plan]) -> None:
        self.plans = plans
        self.version: str | None = None

    async def health(self) -> None:
        await trio.lowlevel.checkpoint()

    async def load_weights(self, path: str, version: str) -> None:
        behaviour = self.plans[int(version)].pin
        if behaviour == "hang":
            await trio.sleep_forever()
        if behaviour == "unhealthy":
            raise ConnectionError("engine died")
        if behaviour != "violation":
            self.version = version

    async def weight_version(self) -> str | None:
        await trio.lowlevel.checkpoint()
        return self.version


class ScriptedEval(CheckpointEvalFn):
    def __init__(self, plans: dict[int, Plan], staging: Staging) -> None:
        self.plans = plans
        self.staging = staging

    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        self.staging.observe()
        behaviour = self.plans[input.rollout_id].eval
        if behaviour == "hang":
            await trio.sleep_forever()
        if behaviour == "slow":
            await trio.sleep(4)
        if behaviour == "skip":
            raise EvalSkip("no_data")
        if behaviour == "crash":
            raise RuntimeError("eval bug")
        return RolloutFnEvalOutput(data={})


def make_export(plan: Plan, staging: Staging) -> Any:
    async def export(step: int, path: str) -> None:
        if plan.export != "no_weights":
            Path(path, "model.safetensors").write_bytes(b"w")
        staging.observe()
        await trio.sleep(0.1)
        if plan.export == "hang":
            await trio.sleep_forever()
        if plan.export == "fail":
            raise OSError(28, "No space left on device")

    return export


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(plans, min_size=1, max_size=8),
    max_in_flight=st.integers(1, 3),
    keep=st.integers(0, 2),
    overflow=st.sampled_from(["backpressure", "skip", "latest"]),
    eval_timeout=st.sampled_from([None, 5.0]),
    close_budget=st.sampled_from([0.5, 5.0, 60.0]),
)
def test_every_step_settles_once_and_staging_stays_bounded(
    steps: list[Plan],
    max_in_flight: int,
    keep: int,
    overflow: str,
    eval_timeout: float | None,
    close_budget: float,
) -> None:
    by_step = dict(enumerate(steps))
    sink = MemorySink()
    with tempfile.TemporaryDirectory() as root:
        staging = Staging(root)
        config = EvalConfig(
            hf_dir=root, max_in_flight=max_in_flight, keep_snapshots=keep,
            overflow=overflow,  # type: ignore[arg-type]
            export_timeout=10, pin_timeout=10, eval_timeout=eval_timeout,
        )

        submitted: list[int] = []

        async def main() -> None:
            fleet = Fleet([ScriptedEngine(by_step)])
            async with EvalSupervisor.open(config, eval_fn=ScriptedEval(by_step, staging), fleet=fleet,
                                           sink=sink) as sup:
                for step, plan in by_step.items():
                    with trio.move_on_after(30):
                        await sup.submit(step, export=make_export(plan, staging), force=plan.force)
                        submitted.append(step)
                    staging.observe()
                    await trio.sleep(plan.gap)
                report = await sup.aclose(timeout=close_budget)
            assert set(report.abandoned) <= set(submitted)
            assert all(sink.by_step()[s].reason == "closed" for s in report.abandoned)

        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))

        assert staging.peak <= keep + max_in_flight
        assert Counter(o.step for o in sink.outcomes) == Counter(submitted)
        names = os.listdir(root)
        assert not [n for n in names if n.startswith(".tmp-")]
        assert len([n for n in names if n.startswith("step_")]) <= keep
    for outcome in sink.outcomes:
        assert (outcome.status == "ok") == (outcome.reason is None)

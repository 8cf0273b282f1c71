"""The weight probe off the pin's critical path: the evaluation starts once the engines have
answered the probe, the snapshot's reference is computed meanwhile, and the point settles
only after the verdict. The reference is real (transformers on tiny snapshots) and held back
by an event the test (or the evaluation) releases, so every ordering here is deterministic."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
import trio.testing

from actorsys import (
    CheckpointEvalFn,
    EvalConfig,
    EvalSupervisor,
    Fleet,
    MemorySink,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from actorsys.fleet.pin.probe import Reference, WeightsMismatchError, compute_reference
from actorsys.fleet.pin.reference import ReferenceWorker
from actorsys.fleet.pin.verdict import PinVerdict, ProbeCancelledError
from tests.fakes import FakeEngine
from tests.fleet.conftest import TinyModels

# Reference answers computed once for the module: its tests share one worker.
pytestmark = pytest.mark.xdist_group("fleet/test_verdict")


class AnswersAs(FakeEngine):
    """Reads back whatever version it loads, and answers the probe as ``serves`` does (its
    greedy tokens, computed before the test starts): the right label over other weights,
    unless ``serves`` is the snapshot being pinned."""

    def __init__(self, name: str, answers: dict[str, list[list[int]]], serves: str) -> None:
        super().__init__(name)
        self.answers = answers
        self.serves = serves
        self.answered = trio.Event()

    async def greedy_tokens(
        self, prompts: Sequence[Sequence[int]], max_tokens: int
    ) -> list[list[int]]:
        await trio.lowlevel.checkpoint()
        self.answered.set()
        return self.answers[self.serves]


class ReleasesTheReference(CheckpointEvalFn):
    """Scores 1.0; when it starts, it lets the held-back reference go on (so the verdict can
    only come after the evaluation started), then returns at once."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate
        self.started: list[int] = []
        self.finished = trio.Event()

    async def evaluate_checkpoint(
        self, checkpoint_dir: str, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        self.started.append(input.rollout_id)
        self.gate.set()
        await trio.lowlevel.checkpoint()
        self.finished.set()
        return RolloutFnEvalOutput(data={}, metrics={"score": 1.0})


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Holds every reference back until set (and sets it when the test ends); the reference
    itself is the worker process's."""
    release = threading.Event()
    compute = ReferenceWorker.compute

    async def held(self: ReferenceWorker, path: str, prompts: list[list[int]]) -> Reference:
        await trio.to_thread.run_sync(release.wait, abandon_on_cancel=True)
        return await compute(self, path, prompts)

    monkeypatch.setattr(ReferenceWorker, "compute", held)
    yield release
    release.set()


@pytest.fixture(scope="module")
def answers(tiny: TinyModels) -> dict[str, list[list[int]]]:
    return {name: compute_reference(str(getattr(tiny, name))).tokens for name in ("step1", "step2")}


def config(tmp_path: Path) -> EvalConfig:
    return EvalConfig(hf_dir=tmp_path / "staging", pin_timeout=120.0, close_timeout=10.0)


async def test_a_lying_engine_is_a_pin_violation_even_when_the_evaluation_already_started(
    tiny: TinyModels, tmp_path: Path, gate: threading.Event, answers: dict[str, list[list[int]]]
) -> None:
    engine = AnswersAs("liar", answers, serves="step2")
    eval_fn = ReleasesTheReference(gate)
    sink = MemorySink()
    async with EvalSupervisor.open(config(tmp_path), eval_fn=eval_fn, fleet=Fleet([engine]),
                                   sink=sink) as sup:
        await sup.submit(1, checkpoint_dir=tiny.step1)
        await sup.drain(timeout=120)
        gate.clear()
        await sup.submit(2, checkpoint_dir=tiny.step2)
        await sup.drain(timeout=120)
    assert eval_fn.started == [1, 2]
    lied, honest = sink.by_step()[1], sink.by_step()[2]
    assert (lied.status, lied.reason) == ("skipped", "pin_violation")
    assert "reads back version '1' but does not serve its weights" in lied.data["error"]
    assert "the evaluation's result is discarded" in lied.data["error"]
    assert "score" not in lied.metrics
    assert honest.ok and honest.metrics["score"] == 1.0


async def test_the_evaluation_starts_before_the_reference_and_the_point_settles_after_it(
    tiny: TinyModels, tmp_path: Path, gate: threading.Event, answers: dict[str, list[list[int]]]
) -> None:
    engine = AnswersAs("honest", answers, serves="step1")
    eval_fn = ReleasesTheReference(threading.Event())
    sink = MemorySink()
    async with EvalSupervisor.open(config(tmp_path), eval_fn=eval_fn, fleet=Fleet([engine]),
                                   sink=sink) as sup:
        await sup.submit(1, checkpoint_dir=tiny.step1)
        await eval_fn.finished.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert sink.outcomes == [] and sup.statistics().in_flight == 1
        gate.set()
        await sup.drain(timeout=120)
    outcome = sink.by_step()[1]
    assert outcome.ok and outcome.weight_version == "1"


async def test_a_verdict_cut_off_before_the_reference_is_ready_is_a_pin_timeout(
    tiny: TinyModels, gate: threading.Event, answers: dict[str, list[list[int]]]
) -> None:
    fleet = Fleet([AnswersAs("engine", answers, serves="step1")])
    async with trio.open_nursery() as nursery:
        verdict: PinVerdict = await nursery.start(fleet.pin_and_verify, str(tiny.step1), "1")
        assert fleet.version == "1" and not verdict.settled
        nursery.cancel_scope.cancel()
    with pytest.raises(ProbeCancelledError) as caught:
        await verdict.wait()
    assert caught.value.reason == "pin_timeout"


async def test_pin_waits_for_the_verdict_and_raises_its_mismatch(
    tiny: TinyModels, gate: threading.Event, answers: dict[str, list[list[int]]]
) -> None:
    engine = AnswersAs("liar", answers, serves="step2")
    fleet = Fleet([engine])
    gate.set()
    with pytest.raises(WeightsMismatchError):
        await fleet.pin(str(tiny.step1), "1")
    assert engine.answered.is_set() and fleet.version is None

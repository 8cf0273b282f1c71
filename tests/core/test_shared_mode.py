"""Shared mode with in-process engines: served points, their routing, the shared pin, the
weight gate under both policies, and the version read again before a point settles.

The real engines (a CPU engine whose weights a test trainer updates) are in
``tests/fleet/test_shared_fleet.py``; these are the deterministic tests of our own logic.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
import trio.testing

from actorsys import ConfigError, EvalConfig, EvalSupervisor, Fleet, MemorySink
from actorsys.contracts import CheckpointEvalFn, RolloutFnEvalInput, RolloutFnEvalOutput
from actorsys.fleet.pin.probe.agreement import disagreement
from actorsys.fleet.pin.probe.compare import PrefillAnswer
from tests.fakes import FakeEngine, GatedEval, RecordingEval, tiny_state_dict


class SharedEngine:
    """A rollout engine the test's trainer labels itself; it answers the token probe with
    the tokens its ``weights`` name (engines with the same weights answer alike)."""

    def __init__(self, name: str, weights: int = 0) -> None:
        self.name = name
        self.version: str | None = None
        self.weights = weights
        self.loads: list[tuple[str, str]] = []
        self.reads = 0

    async def health(self) -> None:
        await trio.lowlevel.checkpoint()

    async def load_weights(self, path: str, version: str) -> None:
        self.loads.append((path, version))
        await trio.lowlevel.checkpoint()

    async def weight_version(self) -> str | None:
        await trio.lowlevel.checkpoint()
        self.reads += 1
        return self.version

    async def greedy_tokens(
        self, prompts: Sequence[Sequence[int]], max_tokens: int
    ) -> list[list[int]]:
        await trio.lowlevel.checkpoint()
        return [[(p[0] + self.weights * 7 + i) % 97 for i in range(max_tokens)] for p in prompts]


class ServedEval(CheckpointEvalFn):
    """Records what a served point hands the eval fn."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str | None, str | None, str | None]] = []

    async def evaluate_checkpoint(
        self, checkpoint_dir: str | None, input: RolloutFnEvalInput  # type: ignore[override]
    ) -> RolloutFnEvalOutput:
        assert input.fleet is not None
        self.seen.append((input.rollout_id, checkpoint_dir, input.weight_version,
                          input.fleet.version))
        await trio.lowlevel.checkpoint()
        return RolloutFnEvalOutput(data={}, metrics={"score": 1.0})


def write_base(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text('{"vocab_size": 97, "model_type": "llama"}')
    return path


async def test_a_served_point_is_evaluated_on_the_shared_fleet_without_a_load_or_a_snapshot(
    tmp_path: Path,
) -> None:
    engine = SharedEngine("rollout")
    engine.version = "3"
    sink = MemorySink()
    eval_fn = ServedEval()
    config = EvalConfig(base_checkpoint=str(write_base(tmp_path / "base")))
    async with EvalSupervisor.open(
        config, eval_fn=eval_fn, fleet=Fleet([engine], shared=True), sink=sink
    ) as sup:
        assert await sup.submit(3, served=True)
        await sup.drain()
        engine.version = "v-custom"
        assert await sup.submit(4, served="v-custom")
        await sup.drain()
    assert [(o.step, o.status, o.snapshot, o.weight_version) for o in sink.outcomes] == [
        (3, "ok", None, "3"), (4, "ok", None, "v-custom"),
    ]
    assert eval_fn.seen == [(3, None, "3", "3"), (4, None, "v-custom", "v-custom")]
    assert engine.loads == []


async def test_served_points_go_only_to_shared_fleets_and_the_others_only_to_the_rest(
    staging: Path, sink: MemorySink
) -> None:
    shared_engine, own_engine = SharedEngine("rollout"), FakeEngine("eval")
    shared_engine.version = "5"
    shared, dedicated = Fleet([shared_engine], shared=True), Fleet([own_engine])
    eval_fn = RecordingServedEval()
    async with EvalSupervisor.open(
        EvalConfig(hf_dir=staging), eval_fn=eval_fn, fleet=[dedicated, shared], sink=sink
    ) as sup:
        await sup.submit(5, served=True)
        await sup.submit(6, state_dict=tiny_state_dict())
        await sup.drain()
    assert {o.step: o.status for o in sink.outcomes} == {5: "ok", 6: "ok"}
    assert eval_fn.fleets == {5: shared, 6: dedicated}
    assert shared_engine.loads == [] and [v for _, v in own_engine.loads] == ["6"]


class RecordingServedEval(CheckpointEvalFn):
    def __init__(self) -> None:
        self.fleets: dict[int, object] = {}

    async def evaluate_checkpoint(
        self, checkpoint_dir: str | None, input: RolloutFnEvalInput  # type: ignore[override]
    ) -> RolloutFnEvalOutput:
        self.fleets[input.rollout_id] = input.fleet
        await trio.lowlevel.checkpoint()
        return RolloutFnEvalOutput(data={})


async def test_a_point_no_fleet_takes_is_a_config_error_that_changes_nothing(
    staging: Path, sink: MemorySink
) -> None:
    engine = SharedEngine("rollout")
    async with EvalSupervisor.open(
        EvalConfig(hf_dir=staging), eval_fn=RecordingEval(), fleet=Fleet([engine], shared=True),
        sink=sink,
    ) as sup:
        with pytest.raises(ConfigError, match="every fleet of this supervisor is shared"):
            await sup.submit(1, state_dict=tiny_state_dict())
        assert sup.statistics().in_flight == 0
    async with EvalSupervisor.open(
        EvalConfig(hf_dir=staging), eval_fn=RecordingEval(), fleet=Fleet([FakeEngine("e")]),
        sink=sink,
    ) as sup:
        with pytest.raises(ConfigError, match="has none"):
            await sup.submit(1, served=True)
        # the step was not taken: it may be submitted again, as an exported point
        assert await sup.submit(1, state_dict=tiny_state_dict())
        await sup.drain()
    assert [(o.step, o.status) for o in sink.outcomes] == [(1, "ok")]


def test_resume_with_only_shared_fleets_is_a_config_error(staging: Path) -> None:
    # resumed points are evaluated from snapshots, which a shared fleet never loads
    with pytest.raises(ConfigError, match="resume"):
        EvalSupervisor(EvalConfig(hf_dir=staging, resume=True), eval_fn=RecordingEval(),
                       fleet=Fleet([SharedEngine("rollout")], shared=True))
    both = [Fleet([SharedEngine("rollout")], shared=True), Fleet([FakeEngine("e")])]
    assert EvalSupervisor(EvalConfig(hf_dir=staging, resume=True), eval_fn=RecordingEval(),
                          fleet=both)


async def test_a_shared_fleet_is_read_again_until_it_serves_the_version_then_pin_violation(
    autojump_clock: trio.testing.MockClock, sink: MemorySink
) -> None:
    engine = SharedEngine("rollout")
    engine.version = "1"
    config = EvalConfig(pin_timeout=30.0)
    async with EvalSupervisor.open(
        config, eval_fn=ServedEval(), fleet=Fleet([engine], shared=True), sink=sink
    ) as sup:
        await sup.submit(2, served=True)
        await trio.sleep(5)  # the trainer's update lands late
        engine.version = "2"
        await sup.drain()
        await sup.submit(3, served=True)  # never served
        await sup.drain()
    assert [(o.step, o.status, o.reason) for o in sink.outcomes] == [
        (2, "ok", None), (3, "skipped", "pin_violation"),
    ]
    assert "at the pin deadline" in sink.outcomes[1].data["error"]


async def test_weight_update_waits_for_the_served_points_admitted_before_it(
    autojump_clock: trio.testing.MockClock, sink: MemorySink
) -> None:
    engine = SharedEngine("rollout")
    engine.version = "1"
    eval_fn = GatedEval()
    async with EvalSupervisor.open(
        EvalConfig(), eval_fn=eval_fn, fleet=Fleet([engine], shared=True), sink=sink
    ) as sup:
        await sup.submit(1, served=True)
        await eval_fn.wait_started(1)

        async def finish_later() -> None:
            await trio.sleep(3)
            eval_fn.release(1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(finish_later)
            entered = trio.current_time()
            async with sup.weight_update(timeout=20):
                waited = trio.current_time() - entered
                assert [o.step for o in sink.outcomes] == [1]
                engine.version = "2"
        assert 2.9 < waited < 3.5
        stats = sup.statistics()
        assert stats.weight_update_waits == 1 and 2.9 < stats.weight_update_wait_seconds < 3.5
    assert [(o.step, o.status) for o in sink.outcomes] == [(1, "ok")]


@pytest.mark.parametrize("policy", ["wait", "preempt"])
async def test_a_hanging_evaluation_is_preempted_and_a_queued_point_superseded(
    autojump_clock: trio.testing.MockClock, sink: MemorySink, policy: str
) -> None:
    engine = SharedEngine("rollout")
    engine.version = "1"
    eval_fn = GatedEval()  # step 1 hangs: its gate never opens
    config = EvalConfig(shared_update=policy, shared_update_timeout=10.0)  # type: ignore[arg-type]
    async with EvalSupervisor.open(
        config, eval_fn=eval_fn, fleet=Fleet([engine], shared=True), sink=sink
    ) as sup:
        await sup.submit(1, served=True)
        await eval_fn.wait_started(1)
        await sup.submit(2, served="1")  # queued behind step 1 on the one fleet
        entered = trio.current_time()
        async with sup.weight_update():
            took = trio.current_time() - entered
            engine.version = "3"
            await sup.submit(3, served=True)
            await trio.sleep(1)
            assert 3 not in eval_fn.started  # nothing starts inside the block
        await eval_fn.wait_started(3)
        eval_fn.release(3)
        await sup.drain()
    assert took == pytest.approx(10.0 if policy == "wait" else 0.0, abs=0.1)
    assert {o.step: (o.status, o.reason) for o in sink.outcomes} == {
        1: ("skipped", "preempted"), 2: ("skipped", "superseded"), 3: ("ok", None),
    }


async def test_an_update_outside_the_gate_discards_the_scores_as_pin_violation(
    sink: MemorySink,
) -> None:
    engine = SharedEngine("rollout")
    engine.version = "1"
    eval_fn = GatedEval()
    async with EvalSupervisor.open(
        EvalConfig(), eval_fn=eval_fn, fleet=Fleet([engine], shared=True), sink=sink
    ) as sup:
        await sup.submit(1, served=True)
        await eval_fn.wait_started(1)
        engine.version = "2"  # the trainer updates without weight_update
        eval_fn.release(1)
        await sup.drain()
    (outcome,) = sink.outcomes
    assert (outcome.status, outcome.reason) == ("skipped", "pin_violation")
    assert "changed during the evaluation" in outcome.data["error"]


async def test_a_liar_among_honest_shared_engines_is_a_pin_violation(
    tmp_path: Path, sink: MemorySink
) -> None:
    honest = [SharedEngine("a"), SharedEngine("b")]
    liar = SharedEngine("c", weights=1)  # labels the version, serves other weights
    for engine in (*honest, liar):
        engine.version = "1"
    config = EvalConfig(base_checkpoint=str(write_base(tmp_path / "base")))
    async with EvalSupervisor.open(
        config, eval_fn=ServedEval(), fleet=Fleet([*honest, liar], shared=True), sink=sink
    ) as sup:
        await sup.submit(1, served=True)
        await sup.drain()
        liar.weights = 0
        await sup.submit(2, served="1")
        await sup.drain()
    assert [(o.step, o.reason) for o in sink.outcomes] == [(1, "pin_violation"), (2, None)]
    assert "'c' answer the probe unlike the majority (a, b)" in sink.outcomes[0].data["error"]


def test_agreement_needs_a_strict_majority() -> None:
    class Named:
        def __init__(self, name: str) -> None:
            self.name = name

    same = PrefillAnswer([[-5.0, -3.0, -7.0, -4.0]] * 4)
    near = PrefillAnswer([[-5.001, -3.0, -7.002, -4.0]] * 4)
    other = PrefillAnswer([[-3.0, -6.5, -4.0, -7.5]] * 4)
    engines = [Named("a"), Named("b"), Named("c")]
    assert disagreement(engines, [same, near, None], "1") is None
    two = disagreement(engines[:2], [same, other], "1")
    assert two is not None and two.dissenters == ["a", "b"] and "no strict majority" in str(two)
    three = disagreement(engines, [same, other, near], "1")
    assert three is not None and three.dissenters == ["b"]
    assert disagreement(engines, [same, None, None], "1") is None  # one answer: version only

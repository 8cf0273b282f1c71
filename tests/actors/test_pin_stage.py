"""FleetPinner: health, parallel loads, version read-back, retries, deadline, leasing."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from actorsys import EvalConfig, EvalSupervisor, Fleet, MemorySink
from tests.fakes import FakeEngine, GatedEval, RecordingEval, tiny_state_dict


async def test_every_engine_is_pinned_to_the_step_version(staging: Path, sink: MemorySink) -> None:
    engines = [FakeEngine("a"), FakeEngine("b")]
    eval_fn = RecordingEval()
    async with EvalSupervisor.open(
        EvalConfig(hf_dir=staging), eval_fn=eval_fn, fleet=Fleet(engines), sink=sink
    ) as sup:
        await sup.submit(12, state_dict=tiny_state_dict())
    outcome = sink.by_step()[12]
    assert outcome.ok and outcome.weight_version == "12"
    assert [e.version for e in engines] == ["12", "12"]
    assert engines[0].loads == [(str(staging / "step_12"), "12")]
    assert "eval/pin_time_seconds" in outcome.metrics


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        (FakeEngine("b", healthy=False), "health"),
        (FakeEngine("b", version_error=True), "weight version"),
    ],
)
async def test_unhealthy_engine_skips_the_point_and_the_next_point_works(
    staging: Path, sink: MemorySink, engine: FakeEngine, message: str
) -> None:
    fleet = Fleet([FakeEngine("a"), engine])
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=RecordingEval(),
                                   fleet=fleet, sink=sink) as sup:
        await sup.submit(1, state_dict=tiny_state_dict())
        await sup.drain()
        engine.healthy, engine.version_error = True, False
        await sup.submit(2, state_dict=tiny_state_dict())
    first = sink.by_step()[1]
    assert first.reason == "unhealthy" and message in first.data["error"] and "'b'" in first.data["error"]
    assert sink.by_step()[2].ok
    assert sorted(p.name for p in staging.iterdir()) == ["journal.jsonl", "step_2"]


async def test_engine_keeping_old_weights_is_retried_then_a_pin_violation(
    staging: Path, sink: MemorySink
) -> None:
    liar = FakeEngine("liar", keep_old_weights=True)
    config = EvalConfig(hf_dir=staging, pin_retries=2)
    async with EvalSupervisor.open(config, eval_fn=RecordingEval(), fleet=Fleet([FakeEngine("a"), liar]),
                                   sink=sink) as sup:
        await sup.submit(5, state_dict=tiny_state_dict())
    outcome = sink.by_step()[5]
    assert outcome.reason == "pin_violation" and outcome.weight_version is None
    assert len(liar.loads) == 3


async def test_mismatch_that_heals_on_retry_is_pinned(staging: Path, sink: MemorySink) -> None:
    flaky = FakeEngine("flaky", keep_old_weights=True)
    original_load = flaky.load_weights

    async def load_then_heal(path: str, version: str) -> None:
        await original_load(path, version)
        flaky.keep_old_weights = False

    flaky.load_weights = load_then_heal  # type: ignore[method-assign]
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging, pin_retries=1), eval_fn=RecordingEval(),
                                   fleet=Fleet([flaky]), sink=sink) as sup:
        await sup.submit(1, state_dict=tiny_state_dict())
    assert sink.by_step()[1].ok and len(flaky.loads) == 2


async def test_pin_timeout_bounds_a_hanging_load(
    staging: Path, sink: MemorySink, autojump_clock: trio.testing.MockClock
) -> None:
    gate = trio.Event()
    hanging = FakeEngine("hang", load_gate=gate)
    config = EvalConfig(hf_dir=staging, pin_timeout=45)
    async with EvalSupervisor.open(config, eval_fn=RecordingEval(), fleet=Fleet([hanging]), sink=sink) as sup:
        await sup.submit(1, state_dict=tiny_state_dict())
        await sup.drain()
        assert trio.current_time() == pytest.approx(45)
        gate.set()
        await sup.submit(2, state_dict=tiny_state_dict())
        await sup.drain()
    assert sink.by_step()[1].reason == "pin_timeout"
    assert sink.by_step()[1].metrics["eval/pin_time_seconds"] == pytest.approx(45)
    assert sink.by_step()[2].ok


async def test_fleet_is_never_repinned_while_an_eval_runs_on_it(staging: Path, sink: MemorySink) -> None:
    engine = FakeEngine("only")
    eval_fn = GatedEval()
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=eval_fn, fleet=Fleet([engine]),
                                   sink=sink) as sup:
        await sup.submit(1, state_dict=tiny_state_dict())
        await sup.submit(2, state_dict=tiny_state_dict())
        await eval_fn.wait_started(1)
        await trio.testing.wait_all_tasks_blocked()
        assert [version for _, version in engine.loads] == ["1"]
        eval_fn.release(1)
        await eval_fn.wait_started(2)
        assert [version for _, version in engine.loads] == ["1", "2"]
        eval_fn.release(2)
    assert [o.weight_version for o in sink.outcomes] == ["1", "2"]


async def test_several_fleets_evaluate_in_parallel_one_point_each(staging: Path, sink: MemorySink) -> None:
    fleets = [Fleet([FakeEngine("a")]), Fleet([FakeEngine("b")])]
    eval_fn = GatedEval()
    config = EvalConfig(hf_dir=staging, max_in_flight=3)
    async with EvalSupervisor.open(config, eval_fn=eval_fn, fleet=fleets, sink=sink) as sup:
        for step in (1, 2, 3):
            await sup.submit(step, state_dict=tiny_state_dict())
        await eval_fn.wait_started(1)
        await eval_fn.wait_started(2)
        await trio.testing.wait_all_tasks_blocked()
        assert eval_fn.running == 2 and eval_fn.started == [1, 2]
        eval_fn.release(2)
        await eval_fn.wait_started(3)
        eval_fn.release(1)
        eval_fn.release(3)
    assert eval_fn.max_running == 2
    assert {o.step for o in sink.outcomes if o.ok} == {1, 2, 3}


def test_fleet_rejects_engines_that_are_not_engines() -> None:
    with pytest.raises(TypeError, match="not an Engine"):
        Fleet([object()])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="unique"):
        Fleet([FakeEngine("x"), FakeEngine("x")])
    with pytest.raises(ValueError, match="at least one"):
        Fleet([])

"""The real eval fleet: embedded engines as processes on loopback, sglang-router in front,
pinned through EvalSupervisor, with real faults. Wall-clock bound: each test has a timeout.

Each fleet start costs a few engine processes (each imports torch and transformers and loads
its model), so a test takes one fleet through several neighbouring faults in turn."""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio

from actorsys.fleet.local import EngineSpec, LocalEngine, LocalFleet, embedded
from tests.fleet.conftest import TinyModels, corrupt_copy
from tests.fleet.pipeline import MAX_TOKENS, assert_pinned, evaluate, pipeline
from tests.models import PROMPTS


def fleet_specs(tiny: TinyModels, count: int, *extra: Sequence[str]) -> list[EngineSpec]:
    """``count`` embedded engines on the base model; ``extra[i]`` are engine i's arguments."""
    return [
        embedded(str(tiny.base), extra_args=extra[i] if i < len(extra) else ())
        for i in range(count)
    ]


async def kill(engine: LocalEngine) -> None:
    pid = engine.process.command_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    await engine.process.wait()


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_two_engines_behind_the_router_serve_exactly_the_pinned_snapshot_through_faults(
    tiny: TinyModels, tmp_path: Path
) -> None:
    """Pinned points are served exactly, through the router; a corrupt snapshot is skipped
    and the engines keep serving the previous one; a killed engine (never restarted by the
    fleet here) skips the next point as unhealthy, and once restarted the next one pins."""
    corrupt = corrupt_copy(tiny.step2, tmp_path / "corrupt")
    async with LocalFleet.open(fleet_specs(tiny, 2), router=True, max_restarts=0) as local:
        assert local.fleet.base_url == local.router_url
        async with pipeline(tiny, tmp_path, local.fleet) as (sup, sink):
            first = await evaluate(sup, sink, tiny, 1)
            assert_pinned(first, engines=2)

            skipped = await evaluate(sup, sink, tiny, 2, checkpoint_dir=corrupt)
            assert (skipped.status, skipped.reason) == ("skipped", "ckpt_invalid")
            assert [await e.weight_version() for e in local.fleet.engines] == ["1", "1"]
            answers = await local.fleet.complete(
                PROMPTS, max_tokens=MAX_TOKENS, check_version=False
            )
            assert [a.text for a in answers] == first.data["expected"]

            await kill(local.engines[0])
            skipped = await evaluate(sup, sink, tiny, 3)
            assert (skipped.status, skipped.reason) == ("skipped", "unhealthy")
            await local.restart(0)
            assert_pinned(await evaluate(sup, sink, tiny, 4), engines=2)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_stopped_engine_skips_the_point_at_the_pin_deadline_and_the_next_one_pins(
    tiny: TinyModels, tmp_path: Path
) -> None:
    # The deadline is what is tested, so the probe is off: with it, the first pin's verdict
    # waits for the reference worker to start (tens of seconds on a busy machine), and the
    # deadline would have to cover that. A pin of the tiny model takes well under a second
    # of CPU; the deadline leaves room for a machine whose other core is busy.
    pin_timeout = 10.0
    async with LocalFleet.open(fleet_specs(tiny, 2)) as local:
        async with pipeline(tiny, tmp_path, local.fleet, pin_timeout=pin_timeout,
                            probe=False) as (sup, sink):
            assert_pinned(await evaluate(sup, sink, tiny, 1), engines=2)
            pid = local.engines[1].process.command_pid()
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            try:
                skipped = await evaluate(sup, sink, tiny, 2)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert (skipped.status, skipped.reason) == ("skipped", "pin_timeout")
            assert pin_timeout <= skipped.metrics["eval/pin_time_seconds"] < pin_timeout + 2.0
            assert_pinned(await evaluate(sup, sink, tiny, 3), engines=2)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_engines_that_keep_their_old_weights_are_pin_violations_by_version_or_by_the_probe(
    tiny: TinyModels, tmp_path: Path
) -> None:
    """Engine 1 keeps its old weights and version: the version read back catches it. Once it
    is replaced by an honest engine, engine 0, which keeps its old weights but labels them
    with the new version, is caught by the probe (and engine 1, now honest, is not named)."""
    liar = ("--test-keep-old-weights", "--test-label-kept-weights")
    specs = fleet_specs(tiny, 2, liar, ("--test-keep-old-weights",))
    async with LocalFleet.open(specs) as local:
        async with pipeline(tiny, tmp_path, local.fleet) as (sup, sink):
            violated = await evaluate(sup, sink, tiny, 1)
            assert (violated.status, violated.reason) == ("skipped", "pin_violation")
            assert "'default'" in violated.data["error"]
            await local.restart(1, spec=embedded(str(tiny.base)))
            violated = await evaluate(sup, sink, tiny, 2)
        assert (violated.status, violated.reason) == ("skipped", "pin_violation")
        error = violated.data["error"]
        assert "reads back version '2' but does not serve its weights" in error
        assert "embedded-0" in error and "embedded-1" not in error
        assert [await e.weight_version() for e in local.fleet.engines] == ["2", "2"]


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_killed_engine_comes_back_and_pins_again_until_the_fleet_gives_up_on_it(
    tiny: TinyModels, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with LocalFleet.open(fleet_specs(tiny, 1), max_restarts=1, restart_period=600) as local:
        engine = local.engines[0]
        async with pipeline(tiny, tmp_path, local.fleet) as (sup, sink):
            assert_pinned(await evaluate(sup, sink, tiny, 1), engines=1)
            await kill(engine)
            with trio.fail_after(120):
                await engine.wait_state("running", restarts=1)
            # It serves its initial weights again: the next pin must load the snapshot.
            assert await engine.client.weight_version() != "1"
            assert_pinned(await evaluate(sup, sink, tiny, 2), engines=1)
            await kill(engine)
            with trio.fail_after(30):
                await engine.wait_state("gave_up")
            skipped = await evaluate(sup, sink, tiny, 3)
            assert (skipped.status, skipped.reason) == ("skipped", "unhealthy")
    gave_up = [r for r in caplog.records if "gives up on it" in r.getMessage()]
    assert [(r.levelname, r.name) for r in gave_up] == [("ERROR", "actorsys.fleet")]

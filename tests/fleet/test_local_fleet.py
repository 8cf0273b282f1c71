"""The real eval fleet: embedded engines as processes on loopback, sglang-router in front,
pinned through EvalSupervisor, with real faults. Wall-clock bound: each test has a timeout."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from transformers import LlamaConfig

from actorsys import (
    CheckpointEvalFn,
    EvalConfig,
    EvalSupervisor,
    MemorySink,
    Outcome,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from actorsys.fleet.local import EngineSpec, LocalFleet, embedded
from tests.fleet.conftest import TinyModels, corrupt_copy
from tests.models import PROMPTS, greedy, random_model

MAX_TOKENS = 8


class GreedyEval(CheckpointEvalFn):
    """Completes PROMPTS on the pinned fleet and records what transformers answers on the
    same checkpoint, and the version every engine reports."""

    async def evaluate_checkpoint(
        self, checkpoint_dir: str, input: RolloutFnEvalInput
    ) -> RolloutFnEvalOutput:
        fleet = input.fleet
        answers = await fleet.complete(PROMPTS, max_tokens=MAX_TOKENS, request_timeout=30.0)
        expected = await trio.to_thread.run_sync(greedy, checkpoint_dir, PROMPTS, MAX_TOKENS)
        versions = [await engine.weight_version() for engine in fleet.engines]
        return RolloutFnEvalOutput(
            data={
                "texts": [a.text for a in answers],
                "expected": expected,
                "versions": versions,
                "reported": sorted({a.weight_version for a in answers}, key=str),
            }
        )


@asynccontextmanager
async def pipeline(
    tiny: TinyModels, tmp_path: Path, local: LocalFleet, **config: Any
) -> AsyncIterator[tuple[EvalSupervisor, MemorySink]]:
    sink = MemorySink()
    settings: dict[str, Any] = {
        "hf_dir": tmp_path / "staging",
        "base_checkpoint": tiny.base,
        "pin_timeout": 60.0,
        "pin_retries": 1,
        "eval_timeout": 120.0,
        "close_timeout": 10.0,
        **config,
    }
    async with EvalSupervisor.open(
        EvalConfig(**settings), eval_fn=GreedyEval(), fleet=local.fleet, sink=sink
    ) as sup:
        yield sup, sink


async def evaluate(
    sup: EvalSupervisor, sink: MemorySink, tiny: TinyModels, step: int, **source: Any
) -> Outcome:
    """Submit ``step`` (new random weights of the base architecture unless a source is
    given), wait for it to settle, and return its outcome."""
    if not source:
        config = LlamaConfig.from_pretrained(tiny.base)
        source = {"model": random_model(config, seed=100 + step)}
    await sup.submit(step, **source)
    report = await sup.drain(timeout=180)
    assert report.pending == []
    return sink.by_step()[step]


def assert_pinned(outcome: Outcome, engines: int) -> None:
    assert outcome.status == "ok", (outcome.reason, outcome.data)
    data = outcome.data
    assert data["texts"] == data["expected"]
    assert data["versions"] == [str(outcome.step)] * engines
    assert data["reported"] == [str(outcome.step)]


def fleet_specs(tiny: TinyModels, count: int, *extra: Sequence[str]) -> list[EngineSpec]:
    """``count`` embedded engines on the base model; ``extra[i]`` are engine i's arguments."""
    return [
        embedded(str(tiny.base), extra_args=extra[i] if i < len(extra) else ())
        for i in range(count)
    ]


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_two_engines_behind_the_router_serve_exactly_the_pinned_snapshot(
    tiny: TinyModels, tmp_path: Path
) -> None:
    async with LocalFleet.open(fleet_specs(tiny, 2), router=True) as local:
        assert local.fleet.base_url == local.router_url
        async with pipeline(tiny, tmp_path, local) as (sup, sink):
            for step in (1, 2):
                assert_pinned(await evaluate(sup, sink, tiny, step), engines=2)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_killed_engine_skips_the_point_as_unhealthy_and_the_next_one_pins(
    tiny: TinyModels, tmp_path: Path
) -> None:
    async with LocalFleet.open(fleet_specs(tiny, 2), router=True) as local:
        async with pipeline(tiny, tmp_path, local) as (sup, sink):
            assert_pinned(await evaluate(sup, sink, tiny, 1), engines=2)
            pid = local.engines[0].process.command_pid()
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            await local.engines[0].process.wait()
            skipped = await evaluate(sup, sink, tiny, 2)
            assert (skipped.status, skipped.reason) == ("skipped", "unhealthy")
            await local.restart(0)
            assert_pinned(await evaluate(sup, sink, tiny, 3), engines=2)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_stopped_engine_skips_the_point_at_the_pin_deadline_and_the_next_one_pins(
    tiny: TinyModels, tmp_path: Path
) -> None:
    pin_timeout = 5.0
    async with LocalFleet.open(fleet_specs(tiny, 2)) as local:
        async with pipeline(tiny, tmp_path, local, pin_timeout=pin_timeout) as (sup, sink):
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
@pytest.mark.timeout(240)
async def test_engine_that_keeps_its_old_weights_is_a_pin_violation(
    tiny: TinyModels, tmp_path: Path
) -> None:
    specs = fleet_specs(tiny, 2, (), ("--test-keep-old-weights",))
    async with LocalFleet.open(specs) as local:
        async with pipeline(tiny, tmp_path, local) as (sup, sink):
            violated = await evaluate(sup, sink, tiny, 1)
            assert (violated.status, violated.reason) == ("skipped", "pin_violation")
            assert "'default'" in violated.data["error"]
            await local.restart(1, spec=embedded(str(tiny.base)))
            assert_pinned(await evaluate(sup, sink, tiny, 2), engines=2)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_corrupt_snapshot_is_skipped_and_the_engines_keep_serving_the_previous_one(
    tiny: TinyModels, tmp_path: Path
) -> None:
    corrupt = corrupt_copy(tiny.step2, tmp_path / "corrupt")
    async with LocalFleet.open(fleet_specs(tiny, 2)) as local:
        async with pipeline(tiny, tmp_path, local) as (sup, sink):
            first = await evaluate(sup, sink, tiny, 1)
            assert_pinned(first, engines=2)
            skipped = await evaluate(sup, sink, tiny, 2, checkpoint_dir=corrupt)
            assert (skipped.status, skipped.reason) == ("skipped", "ckpt_missing")
            assert [await e.weight_version() for e in local.fleet.engines] == ["1", "1"]
            answers = await local.fleet.complete(
                PROMPTS, max_tokens=MAX_TOKENS, check_version=False
            )
            assert [a.text for a in answers] == first.data["expected"]
            assert_pinned(await evaluate(sup, sink, tiny, 3), engines=2)

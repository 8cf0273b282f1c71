"""Running points through EvalSupervisor on a real fleet, and what a pinned point must show."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from transformers import AutoConfig

from actorsys import (
    CheckpointEvalFn,
    EvalConfig,
    EvalSupervisor,
    Fleet,
    MemorySink,
    Outcome,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from tests.fleet.conftest import TinyModels
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


class ServedGreedy(CheckpointEvalFn):
    """Completes PROMPTS, greedy, on the pinned shared fleet."""

    async def evaluate_checkpoint(
        self, checkpoint_dir: str | None, input: RolloutFnEvalInput  # type: ignore[override]
    ) -> RolloutFnEvalOutput:
        assert checkpoint_dir is None and input.fleet is not None
        answers = await input.fleet.complete(PROMPTS, max_tokens=MAX_TOKENS, concurrency=4)
        return RolloutFnEvalOutput(data={"texts": [a.text for a in answers]})


@asynccontextmanager
async def pipeline(
    tiny: TinyModels, tmp_path: Path, fleet: Fleet, **config: Any
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
        EvalConfig(**settings), eval_fn=GreedyEval(), fleet=fleet, sink=sink
    ) as sup:
        yield sup, sink


async def evaluate(
    sup: EvalSupervisor, sink: MemorySink, tiny: TinyModels, step: int, **source: Any
) -> Outcome:
    """Submit ``step`` (new random weights of the base architecture unless a source is
    given), wait for it to settle, and return its outcome."""
    if not source:
        config = AutoConfig.from_pretrained(tiny.base)
        source = {"model": random_model(config, seed=100 + step)}
    await sup.submit(step, **source)
    report = await sup.drain(timeout=180)
    assert report.pending == []
    return sink.by_step()[step]


def assert_pinned(outcome: Outcome, engines: int, *, answers_carry_version: bool = True) -> None:
    """The point was scored on answers equal to transformers' greedy output on its
    checkpoint, and every engine reports its version (as does every answer, where the engine
    stamps them)."""
    assert outcome.status == "ok", (outcome.reason, outcome.data)
    data = outcome.data
    assert data["texts"] == data["expected"]
    assert data["versions"] == [str(outcome.step)] * engines
    assert data["reported"] == [str(outcome.step) if answers_carry_version else None]


async def evaluate_served(
    engines: list[Any], snapshot: Path, step: int, eval_fn: Any, config: EvalConfig
) -> Outcome:
    """A served point: the test's trainer loads ``snapshot`` onto the shared ``engines``
    itself, labelled ``str(step)`` (a disk-syncing trainer's update, inside
    ``weight_update``), then submits ``step`` served; the point's outcome."""
    sink = MemorySink()
    async with EvalSupervisor.open(
        config, eval_fn=eval_fn, fleet=Fleet(engines, shared=True), sink=sink
    ) as sup:
        async with sup.weight_update():
            for engine in engines:
                await engine.load_weights(str(snapshot), str(step))
        await sup.submit(step, served=True)
        report = await sup.drain(timeout=240)
        assert report.pending == []
    outcome = sink.by_step()[step]
    assert outcome.snapshot is None
    return outcome

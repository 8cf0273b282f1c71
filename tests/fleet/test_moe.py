"""Mixture-of-experts models on the CPU engine: a tiny Qwen3-MoE (4 experts, tied), whose
checkpoints hold per-expert tensors that transformers fuses at load, pinned through
EvalSupervisor with the weight probe on, both ways (A to B and back) and submitted as a
module: every answer is transformers' own on that snapshot."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from actorsys.fleet.embedded.model import GenerationRequest, ModelHost
from actorsys.fleet.local import LocalFleet, embedded
from tests.fleet.conftest import TinyModels
from tests.fleet.pipeline import MAX_TOKENS, assert_pinned, evaluate, pipeline
from tests.models import PROMPTS, greedy


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_moe_model_on_the_cpu_engine_pins_exactly_both_ways_and_as_a_module(
    moe: TinyModels, tmp_path: Path
) -> None:
    async with LocalFleet.open([embedded(str(moe.base))]) as local:
        async with pipeline(moe, tmp_path, local.fleet) as (sup, sink):
            for step, snapshot in ((1, moe.step1), (2, moe.step2), (3, moe.step1)):
                outcome = await evaluate(sup, sink, moe, step, checkpoint_dir=snapshot)
                assert_pinned(outcome, engines=1)
            assert_pinned(await evaluate(sup, sink, moe, 4), engines=1)
    assert sink.by_step()[1].data["texts"] != sink.by_step()[2].data["texts"]


async def test_moe_checkpoint_loaded_in_place_answers_as_transformers_does(moe: TinyModels) -> None:
    host = await trio.to_thread.run_sync(lambda: ModelHost(str(moe.base)))
    prompt = host.encode(PROMPTS[0])
    for snapshot in (moe.step1, moe.step2, moe.step1):
        await trio.to_thread.run_sync(
            lambda path=snapshot: host.load(str(path), str(path), require_complete=True)
        )
        expected = await trio.to_thread.run_sync(greedy, snapshot, PROMPTS[:1], MAX_TOKENS)
        result = await trio.to_thread.run_sync(
            lambda: host.generate([GenerationRequest(prompt, MAX_TOKENS, ignore_eos=True)])
        )
        assert host.decode(result[0].output_ids) == expected[0]

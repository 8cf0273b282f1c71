"""The vLLM tier: a real vLLM server on the CPU, from its own venv (scripts/setup_vllm.sh),
pinned through EvalSupervisor with VLLMEngine, for untied and tied embeddings and a tiny
mixture-of-experts model, both ways (A to B and back). Skipped when .venv-vllm is missing. One
server per test (~30-40 s to start, ~2 GB)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from actorsys.fleet.local import LocalFleet, vllm
from actorsys.fleet.probe import WeightsMismatchError
from tests.fleet.conftest import VLLM_PYTHON, VLLM_TIER, TinyModels, corrupt_copy
from tests.fleet.pipeline import MAX_TOKENS, assert_pinned, evaluate, pipeline
from tests.models import PROMPTS, make_snapshot

pytestmark = VLLM_TIER


@pytest.mark.timeout(600)
async def test_vllm_server_serves_exactly_each_snapshot_it_is_pinned_to(
    tiny: TinyModels, tmp_path: Path
) -> None:
    corrupt = corrupt_copy(tiny.step2, tmp_path / "corrupt")
    spec = vllm(str(tiny.base), python=str(VLLM_PYTHON))
    async with LocalFleet.open([spec], startup_timeout=400) as local:
        engine = local.fleet.engines[0]
        assert await engine.weight_version() == "default"
        async with pipeline(tiny, tmp_path, local.fleet) as (sup, sink):
            for step, snapshot in ((1, tiny.step1), (2, tiny.step2), (3, tiny.step1)):
                outcome = await evaluate(sup, sink, tiny, step, checkpoint_dir=snapshot)
                assert_pinned(outcome, engines=1, answers_carry_version=False)
            refused = await evaluate(sup, sink, tiny, 4, checkpoint_dir=corrupt)
            assert (refused.status, refused.reason) == ("skipped", "ckpt_invalid")
            await engine.health()
            assert await engine.weight_version() == "3"
            answers = await local.fleet.complete(PROMPTS, max_tokens=MAX_TOKENS)
            assert [a.text for a in answers] == sink.by_step()[3].data["expected"]


@pytest.mark.timeout(600)
async def test_tied_model_on_a_launched_vllm_pins_exactly_both_ways_and_never_false_alarms(
    tied: TinyModels, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = vllm(str(tied.base), python=str(VLLM_PYTHON))
    async with LocalFleet.open([spec], startup_timeout=400) as local:
        async with pipeline(tied, tmp_path, local.fleet) as (sup, sink):
            for step, snapshot in ((1, tied.step1), (2, tied.step2), (3, tied.step1)):
                outcome = await evaluate(sup, sink, tied, step, checkpoint_dir=snapshot)
                assert_pinned(outcome, engines=1, answers_carry_version=False)
        with caplog.at_level(logging.WARNING, logger="actorsys.fleet"):
            for seed in range(20):
                snapshot = tmp_path / f"random-{seed}"
                await trio.to_thread.run_sync(
                    lambda path=snapshot, s=seed: make_snapshot(tied.base, path, seed=500 + s)
                )
                await local.fleet.pin(str(snapshot), f"random-{seed}")
        assert not [r for r in caplog.records if "weight probe" in r.getMessage()]


@pytest.mark.timeout(600)
async def test_tied_model_on_a_user_launched_vllm_is_a_pin_violation_unless_served_exactly(
    tied: TinyModels, tmp_path: Path
) -> None:
    spec = vllm(str(tied.base), python=str(VLLM_PYTHON), tied_reload=False)
    async with LocalFleet.open([spec], startup_timeout=400) as local:
        async with pipeline(tied, tmp_path, local.fleet) as (sup, sink):
            sources = ((1, tied.step1), (2, tied.base), (3, tied.step2))
            for step, snapshot in sources:
                await evaluate(sup, sink, tied, step, checkpoint_dir=snapshot)
        outcomes = sink.by_step()
        for step, _ in sources:
            if outcomes[step].ok:
                assert_pinned(outcomes[step], engines=1, answers_carry_version=False)
        assert [outcomes[s].reason for s in (1, 3)] == ["pin_violation", "pin_violation"]
        assert "does not serve its weights" in outcomes[1].data["error"]
        assert outcomes[2].ok
        with pytest.raises(WeightsMismatchError) as caught:
            await local.fleet.pin(str(tied.step2), "4")
        assert caught.value.answer != caught.value.reference


@pytest.mark.timeout(600)
async def test_moe_model_on_a_launched_vllm_pins_exactly_both_ways_and_as_a_module(
    moe: TinyModels, tmp_path: Path
) -> None:
    spec = vllm(str(moe.base), python=str(VLLM_PYTHON))
    async with LocalFleet.open([spec], startup_timeout=400) as local:
        async with pipeline(moe, tmp_path, local.fleet) as (sup, sink):
            for step, snapshot in ((1, moe.step1), (2, moe.step2), (3, moe.step1)):
                outcome = await evaluate(sup, sink, moe, step, checkpoint_dir=snapshot)
                assert_pinned(outcome, engines=1, answers_carry_version=False)
            assert_pinned(await evaluate(sup, sink, moe, 4), engines=1, answers_carry_version=False)
    assert sink.by_step()[1].data["texts"] != sink.by_step()[2].data["texts"]

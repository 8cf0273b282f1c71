"""The vLLM tier: a real vLLM server on the CPU, from its own venv (scripts/setup_vllm.sh),
pinned through EvalSupervisor with VLLMEngine, for untied and tied embeddings and a tiny
mixture-of-experts model, both ways (A to B and back). Skipped when .venv-vllm is missing.
The servers are the lane's shared ones (tests/fleet/vllm_server.py: one per model, started as
a local fleet starts it); starting, keys and ports are tests/fleet/test_vllm_port.py's."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from actorsys import EvalConfig
from actorsys.fleet.clients.vllm import RELOAD
from actorsys.fleet.pin.probe import WeightsMismatchError
from tests.fleet.conftest import VLLM_TIER, TinyModels, corrupt_copy
from tests.fleet.pipeline import (
    MAX_TOKENS,
    ServedGreedy,
    assert_pinned,
    evaluate,
    evaluate_served,
    pipeline,
)
from tests.fleet.vllm_server import SharedVLLM
from tests.models import PROMPTS, greedy, make_snapshot

pytestmark = VLLM_TIER


@pytest.mark.timeout(600)
async def test_vllm_server_serves_exactly_each_snapshot_it_is_pinned_to(
    tiny: TinyModels, tiny_vllm: SharedVLLM, tmp_path: Path
) -> None:
    corrupt = corrupt_copy(tiny.step2, tmp_path / "corrupt")
    fleet = tiny_vllm.fleet()
    engine = fleet.engines[0]
    try:
        async with pipeline(tiny, tmp_path, fleet) as (sup, sink):
            for step, snapshot in ((1, tiny.step1), (2, tiny.step2), (3, tiny.step1)):
                outcome = await evaluate(sup, sink, tiny, step, checkpoint_dir=snapshot)
                assert_pinned(outcome, engines=1, answers_carry_version=False)
            refused = await evaluate(sup, sink, tiny, 4, checkpoint_dir=corrupt)
            assert (refused.status, refused.reason) == ("skipped", "ckpt_invalid")
            await engine.health()
            assert await engine.weight_version() == "3"
            answers = await fleet.complete(PROMPTS, max_tokens=MAX_TOKENS)
            assert [a.text for a in answers] == sink.by_step()[3].data["expected"]
    finally:
        await fleet.aclose()


@pytest.mark.timeout(600)
async def test_tied_model_on_vllm_pins_exactly_through_the_extension_and_is_a_pin_violation_under_its_own_reload(  # noqa: E501
    tied: TinyModels, tied_vllm: SharedVLLM, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    extension, own = tied_vllm.fleet(), tied_vllm.fleet(reload_method=RELOAD)
    try:
        # Through the worker extension (as a local fleet's or ServerEvalFn's vLLM reloads):
        # exact both ways, and twenty random snapshots never raise the probe's alarm.
        async with pipeline(tied, tmp_path / "extension", extension) as (sup, sink):
            for step, snapshot in ((1, tied.step1), (2, tied.step2), (3, tied.step1)):
                outcome = await evaluate(sup, sink, tied, step, checkpoint_dir=snapshot)
                assert_pinned(outcome, engines=1, answers_carry_version=False)
        with caplog.at_level(logging.WARNING, logger="actorsys.fleet"):
            for seed in range(20):
                snapshot = tmp_path / f"random-{seed}"
                await trio.to_thread.run_sync(
                    lambda path=snapshot, s=seed: make_snapshot(tied.base, path, seed=500 + s)
                )
                await extension.pin(str(snapshot), f"random-{seed}")
        assert not [r for r in caplog.records if "weight probe" in r.getMessage()]

        # Through vLLM's own reload (a server started without the extension, as a user might
        # start it, reloads so; tied_reload=False): the head's CPU kernel stays packed from the
        # weights it was last built from, the base's here, so only the base is served exactly
        # and every other snapshot is a pin violation, never a silently wrong score.
        await extension.pin(str(tied.base), "base")
        async with pipeline(tied, tmp_path / "own", own) as (sup, sink):
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
            await own.pin(str(tied.step2), "4")
        assert caught.value.answer != caught.value.reference
    finally:
        await extension.aclose()
        await own.aclose()


@pytest.mark.timeout(600)
async def test_moe_model_on_vllm_pins_exactly_both_ways_and_as_a_module(
    moe: TinyModels, moe_vllm: SharedVLLM, tmp_path: Path
) -> None:
    fleet = moe_vllm.fleet()
    try:
        async with pipeline(moe, tmp_path, fleet) as (sup, sink):
            for step, snapshot in ((1, moe.step1), (2, moe.step2), (3, moe.step1)):
                outcome = await evaluate(sup, sink, moe, step, checkpoint_dir=snapshot)
                assert_pinned(outcome, engines=1, answers_carry_version=False)
            assert_pinned(await evaluate(sup, sink, moe, 4), engines=1, answers_carry_version=False)
    finally:
        await fleet.aclose()
    assert sink.by_step()[1].data["texts"] != sink.by_step()[2].data["texts"]


@pytest.mark.timeout(600)
async def test_a_served_point_on_a_shared_vllm_scores_exactly_the_weights_the_trainer_loaded(
    tiny: TinyModels, tiny_vllm: SharedVLLM, tmp_path: Path
) -> None:
    engine = tiny_vllm.fleet().engines[0]
    config = EvalConfig(base_checkpoint=tiny.base, pin_timeout=120.0, eval_timeout=120.0)
    for step, snapshot in ((21, tiny.step2), (22, tiny.step1)):
        outcome = await evaluate_served([engine], snapshot, step, ServedGreedy(), config)
        assert outcome.status == "ok", (outcome.reason, outcome.data)
        assert outcome.weight_version == str(step)
        expected = await trio.to_thread.run_sync(greedy, snapshot, PROMPTS, MAX_TOKENS)
        assert outcome.data["texts"] == expected

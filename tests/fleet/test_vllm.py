"""The vLLM tier: a real vLLM server on the CPU, from its own venv (scripts/setup_vllm.sh),
pinned through EvalSupervisor with VLLMEngine. Skipped when .venv-vllm is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from actorsys.fleet.local import LocalFleet, vllm
from tests.fleet.conftest import TinyModels, corrupt_copy
from tests.fleet.pipeline import MAX_TOKENS, assert_pinned, evaluate, pipeline
from tests.models import PROMPTS

VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        not VLLM_PYTHON.exists(),
        reason="vLLM tier: .venv-vllm is missing; run scripts/setup_vllm.sh to set it up",
    ),
]


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
            for step, snapshot in ((1, tiny.step1), (2, tiny.step2)):
                outcome = await evaluate(sup, sink, tiny, step, checkpoint_dir=snapshot)
                assert_pinned(outcome, engines=1, answers_carry_version=False)
            refused = await evaluate(sup, sink, tiny, 3, checkpoint_dir=corrupt)
            assert (refused.status, refused.reason) == ("skipped", "ckpt_invalid")
            await engine.health()
            assert await engine.weight_version() == "2"
            answers = await local.fleet.complete(PROMPTS, max_tokens=MAX_TOKENS)
            assert [a.text for a in answers] == sink.by_step()[2].data["expected"]

"""Chat datasets on a launched vLLM server (the vLLM tier, from .venv-vllm): every answer is
what transformers generates greedily from ``apply_chat_template(..., tokenize=True)``, the
template's BOS once (the rendered text sent as a plain prompt would get vLLM's own BOS too,
and other answers), and the samples keep the rendered prompt. One server for the module."""

from __future__ import annotations

from pathlib import Path

import pytest

from actorsys import EvalConfig, EvalSupervisor, MemorySink
from actorsys.evals import ServerEvalFn
from actorsys.fleet.clients.completions import complete
from tests.evals.conftest import CHAT_TOKENS, ChatSet
from tests.evals.test_vllm_server import vllm_argv
from tests.fleet.conftest import VLLM_TIER

pytestmark = VLLM_TIER


@pytest.mark.timeout(600)
async def test_launched_vllm_answers_every_chat_prompt_as_transformers_does(
    chat_set: ChatSet, tmp_path: Path
) -> None:
    evaluation = ServerEvalFn(chat_set.datasets(scorer="exact"), launch=vllm_argv(chat_set.model),
                              ready_timeout=400.0, request_timeout=60.0, pin_timeout=120.0)
    sink = MemorySink()
    config = EvalConfig(hf_dir=tmp_path / "staging", base_checkpoint=chat_set.model,
                        eval_timeout=500.0, close_timeout=10.0)
    try:
        async with EvalSupervisor.open(config, eval_fn=evaluation, sink=sink) as sup:
            await sup.submit(1, checkpoint_dir=chat_set.model)
            assert (await sup.drain(timeout=560)).pending == []
            outcome = sink.by_step()[1]
            assert outcome.status == "ok", (outcome.reason, outcome.data)
            assert evaluation.url is not None
            texts = [s["prompt"] for s in outcome.data["samples"]["direct"]]
            plain = await complete([evaluation.url], texts, max_tokens=CHAT_TOKENS,
                                   api_key=evaluation.api_key)
    finally:
        await evaluation.dispose()
    for name in ("thinking", "direct"):
        assert [s["answer"] for s in outcome.data["samples"][name]] == chat_set.expected[name]
        assert outcome.metrics[f"eval/{name}"] == 1.0
    assert all(text.startswith("<|bos|><|im_start|>") for text in texts)
    assert [a.text for a in plain] == chat_set.double_bos["direct"]

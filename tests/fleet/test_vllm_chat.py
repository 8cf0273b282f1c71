"""The vLLM tier: a vLLM server launched by the local fleet with a tool-call parser serves the
chat API on the same rendered prompts (one BOS) and greedy tokens as transformers, so the CPU
engine's chat endpoint (tested against transformers too) and vLLM answer alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import trio

from actorsys.fleet.local import LocalFleet, vllm
from actorsys.fleet.model_load import load_causal_lm
from tests.chat_models import make_tool_chat_model
from tests.fleet.conftest import VLLM_PYTHON, VLLM_TIER
from tests.fleet.test_embedded_chat import CONVERSATIONS, as_template_expects

pytestmark = VLLM_TIER
MAX_TOKENS = 8


def greedy_ids(model_dir: Path) -> list[tuple[list[int], list[int]]]:
    """Per conversation: transformers' prompt ids and greedy output ids."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = load_causal_lm(model_dir, dtype=torch.float32).eval()
    found = []
    for _, messages, tools in CONVERSATIONS:
        history = [as_template_expects(m) for m in messages]
        rendered = tokenizer.apply_chat_template(history, tools=tools, add_generation_prompt=True,
                                                 return_tensors="pt")
        prompt = rendered["input_ids"]
        with torch.inference_mode():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                 max_new_tokens=MAX_TOKENS)
        found.append((prompt[0].tolist(), out[0, prompt.shape[1]:].tolist()))
    return found


@pytest.mark.timeout(600)
async def test_a_launched_vllm_serves_chat_with_tools_on_the_rendered_prompt(tmp_path: Path) -> None:
    model_dir = await trio.to_thread.run_sync(make_tool_chat_model, tmp_path / "chat")
    expected = await trio.to_thread.run_sync(greedy_ids, model_dir)
    spec = vllm(str(model_dir), python=str(VLLM_PYTHON), tool_call_parser="hermes")
    async with (
        LocalFleet.open([spec], startup_timeout=400) as local,
        httpx.AsyncClient(timeout=120.0, headers={"Authorization": f"Bearer {local.api_key}"}) as client,
    ):
        for (name, messages, tools), (prompt, output) in zip(CONVERSATIONS, expected, strict=True):
            body: dict[str, Any] = {"model": str(model_dir), "messages": messages, "temperature": 0,
                                    "max_tokens": MAX_TOKENS, "return_token_ids": True}
            if tools:
                body["tools"] = tools
            response = await client.post(f"{local.urls[0]}/v1/chat/completions", json=body)
            assert response.status_code == 200, (name, response.text)
            answer = response.json()
            assert answer["usage"]["prompt_tokens"] == len(prompt), name
            assert answer["choices"][0]["token_ids"] == output, name

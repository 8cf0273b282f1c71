"""The README's agent example (examples/agent_eval.py) runs its loop for real: the OpenAI SDK
against the CPU engine's chat endpoint, Hermes tool calls executed by the local calculator,
one score per conversation. The model is a deterministic stand-in (a random model cannot be
made to call a tool): it calls the calculator on the question, then answers with the result."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from actorsys import RolloutFnEvalInput
from actorsys.fleet.embedded.model import GenerationRequest, GenerationResult, ModelHost
from actorsys.fleet.embedded.server import EmbeddedEngine
from tests.chat_models import IM_END, make_tool_chat_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from agent_eval import PROBLEMS, CalculatorAgent, calculate  # noqa: E402


class CalculatorUser(ModelHost):
    """Calls the calculator on the question's expression; once the tool answered, says so."""

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return [self._answer(r) for r in requests]

    def _answer(self, request: GenerationRequest) -> GenerationResult:
        prompt = self.tokenizer.decode(request.input_ids)
        turn = prompt[prompt.rfind("<|im_start|>user"):]
        result = re.search(r"<tool_response>\n(.*?)\n</tool_response>", turn, re.DOTALL)
        if result is not None:
            text = f"The answer is {result.group(1)}."
        else:
            expression = re.findall(r"What is (.*?)\?", prompt)[-1]
            text = ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "'
                    + expression + '"}}\n</tool_call>')
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return GenerationResult(ids + [self.tokenizer.convert_tokens_to_ids(IM_END)], "stop", self.version)


def run_agent(model_dir: Path, agent: CalculatorAgent) -> Any:
    """The agent's evaluation on an asyncio loop, its client talking to the engine's app."""
    import httpx2
    import openai

    async def main() -> Any:
        engine = EmbeddedEngine(CalculatorUser(str(model_dir)), served_model_name="agent")
        serving = asyncio.create_task(engine.run())
        transport = httpx2.ASGITransport(app=engine.app())
        async with openai.AsyncOpenAI(
            base_url="http://engine/v1", api_key="k", http_client=httpx2.AsyncClient(transport=transport)
        ) as client:
            output = await agent.evaluate_with_client(client, "agent", RolloutFnEvalInput(1))
        engine.close()
        await serving
        return output

    return asyncio.run(main())


def test_the_calculator_is_safe_arithmetic() -> None:
    assert calculate("(3 + 4) * 5 - 6") == "29"
    assert calculate("7 / 2") == "3.5"
    assert calculate("__import__('os')").startswith("error")
    assert calculate("1 / 0").startswith("error")


@pytest.mark.timeout(120)
async def test_each_conversation_calls_the_tool_and_is_scored(tmp_path: Path) -> None:
    model_dir = await trio.to_thread.run_sync(make_tool_chat_model, tmp_path / "chat")
    agent = CalculatorAgent([*PROBLEMS, ("What is 2 + 2?", 5.0)])
    output = await trio.to_thread.run_sync(run_agent, model_dir, agent)
    assert output.metrics == {"eval/calculator/solved": 2 / 3, "eval/calculator/tool_calls": 1.0}
    first = output.data["conversations"][0]
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert first["messages"][2]["tool_calls"][0]["function"]["name"] == "calculator"
    assert first["messages"][3]["content"] == "84"
    assert first["messages"][4]["content"] == "The answer is 84."
    assert [c["solved"] for c in output.data["conversations"]] == [True, True, False]

"""The CPU engine's ``/v1/chat/completions``: the served snapshot's template (one BOS), greedy
answers equal to transformers' on the rendered prompt, Hermes tool calls as ``tool_calls``,
and malformed requests refused with the field named."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import trio

from actorsys.fleet.embedded.model import GenerationRequest, GenerationResult, ModelHost
from actorsys.fleet.embedded.server import EmbeddedEngine
from actorsys.fleet.model_load import load_causal_lm
from tests.chat_models import CALCULATOR, IM_END, make_tool_chat_model
from tests.fleet.test_embedded import URL

MAX_TOKENS = 10
ASSISTANT_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "call-1", "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "12 * 7"}'}}],
}
CONVERSATIONS: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None]] = [
    ("system and user", [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "what is two plus two?"}], None),
    ("tools", [{"role": "user", "content": "what is 12 * 7?"}], [CALCULATOR]),
    ("multi-turn with a tool call", [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "what is 12 * 7?"},
        ASSISTANT_CALL,
        {"role": "tool", "tool_call_id": "call-1", "content": "84"},
        {"role": "assistant", "content": "it is 84."},
        {"role": "user", "content": [{"type": "text", "text": "and 2+2?"}]},
    ], [CALCULATOR]),
]


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tool_chat_model(tmp_path_factory.mktemp("chat") / "model", seed=3)


class ScriptedHost(ModelHost):
    """The real host, except that it answers with the texts it is given, in turn (a real model
    cannot be made to write a tool call)."""

    script: list[str]

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        end = self.tokenizer.convert_tokens_to_ids(IM_END)
        return [
            GenerationResult(self.encode_plain(self.script.pop(0)) + [end], "stop", self.version)
            for _ in requests
        ]

    def encode_plain(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


async def serve(host: ModelHost, nursery: trio.Nursery) -> httpx.AsyncClient:
    engine = EmbeddedEngine(host, max_batch=8)
    nursery.start_soon(engine.run)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=engine.app()), base_url=URL)


@pytest.fixture
async def client(chat_dir: Path, nursery: trio.Nursery) -> AsyncIterator[httpx.AsyncClient]:
    host = await trio.to_thread.run_sync(ModelHost, str(chat_dir))
    async with await serve(host, nursery) as client:
        yield client


@pytest.fixture
async def scripted(
    chat_dir: Path, nursery: trio.Nursery
) -> AsyncIterator[tuple[ScriptedHost, httpx.AsyncClient]]:
    host = await trio.to_thread.run_sync(ScriptedHost, str(chat_dir))
    host.script = []
    async with await serve(host, nursery) as client:
        yield host, client


def transformers_answers(model_dir: Path) -> list[tuple[list[int], str]]:
    """For each conversation: the prompt ids transformers' own ``apply_chat_template`` makes,
    and its greedy answer, decoded as vLLM decodes it (special tokens kept where tools are
    parsed, the final end-of-turn token dropped)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = load_causal_lm(model_dir, dtype=torch.float32).eval()
    answers = []
    for _, messages, tools in CONVERSATIONS:
        history = [as_template_expects(m) for m in messages]
        ids = list(tokenizer.apply_chat_template(history, tools=tools, add_generation_prompt=True,
                                                 tokenize=True)["input_ids"])
        with torch.inference_mode():
            prompt = torch.tensor([ids])
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                 do_sample=False, max_new_tokens=MAX_TOKENS)
        new = out[0, len(ids):].tolist()
        if new and new[-1] in model.generation_config.eos_token_id:
            new = new[:-1]
        answers.append((ids, tokenizer.decode(new, skip_special_tokens=not tools)))
    return answers


def as_template_expects(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` as the OpenAI form reaches a template in vLLM: text parts joined, a tool
    call's arguments an object rather than a JSON string."""
    message = dict(message)
    if isinstance(message["content"], list):
        message["content"] = "\n".join(part["text"] for part in message["content"])
    if message.get("tool_calls"):
        message["tool_calls"] = [
            {**call, "function": {**call["function"],
                                  "arguments": json.loads(call["function"]["arguments"])}}
            for call in message["tool_calls"]
        ]
    return message


async def chat(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def test_greedy_chat_answers_equal_transformers_on_the_rendered_template_with_one_bos(
    client: httpx.AsyncClient, chat_dir: Path
) -> None:
    expected = await trio.to_thread.run_sync(transformers_answers, chat_dir)
    from transformers import AutoTokenizer

    bos = AutoTokenizer.from_pretrained(chat_dir).bos_token_id
    for (name, messages, tools), (ids, text) in zip(CONVERSATIONS, expected, strict=True):
        assert ids[0] == bos and ids[1] != bos, name
        body: dict[str, Any] = {"model": "m", "messages": messages, "temperature": 0,
                                "max_tokens": MAX_TOKENS}
        if tools:
            body["tools"] = tools
        answer = await chat(client, **body)
        [choice] = answer["choices"]
        assert "<tool_call>" not in text, "the test needs an answer without a tool call"
        assert choice["message"] == {"role": "assistant", "content": text}, name
        assert answer["usage"]["prompt_tokens"] == len(ids), name
        assert answer["usage"]["total_tokens"] == len(ids) + answer["usage"]["completion_tokens"]
        assert answer["metadata"] == {"weight_version": "default"}
        assert answer["object"] == "chat.completion" and answer["model"] == "m"


async def test_n_seed_stop_and_max_tokens_shape_the_choices(client: httpx.AsyncClient) -> None:
    messages = CONVERSATIONS[0][1]
    sampled = await chat(client, messages=messages, n=3, temperature=1.0, seed=7, max_tokens=6)
    again = await chat(client, messages=messages, n=3, temperature=1.0, seed=7, max_tokens=6)
    texts = [c["message"]["content"] for c in sampled["choices"]]
    assert texts == [c["message"]["content"] for c in again["choices"]]
    assert [c["index"] for c in sampled["choices"]] == [0, 1, 2]
    assert len(set(texts)) > 1
    assert sampled["usage"]["completion_tokens"] <= 18
    greedy = await chat(client, messages=messages, temperature=0, max_tokens=MAX_TOKENS)
    text = greedy["choices"][0]["message"]["content"]
    assert len(text) > 2
    cut = await chat(client, messages=messages, temperature=0, max_tokens=MAX_TOKENS, stop=[text[2:4]])
    assert cut["choices"][0]["message"]["content"] == text[: text.find(text[2:4])]
    assert cut["choices"][0]["finish_reason"] == "stop"


async def test_a_hermes_tool_call_comes_back_as_tool_calls(
    scripted: tuple[ScriptedHost, httpx.AsyncClient],
) -> None:
    host, client = scripted
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call>'
    host.script += [f"Let me compute.\n{call}{call}", call, f"{call}{call}"]
    messages = [{"role": "user", "content": "what is 12 * 7?"}]
    answer = await chat(client, messages=messages, tools=[CALCULATOR], max_tokens=40)
    [choice] = answer["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me compute.\n"
    calls = choice["message"]["tool_calls"]
    assert [c["function"] for c in calls] == [
        {"name": "calculator", "arguments": '{"expression": "12 * 7"}'}] * 2
    assert all(c["type"] == "function" and c["id"].startswith("chatcmpl-tool-") for c in calls)
    assert calls[0]["id"] != calls[1]["id"]
    alone = await chat(client, messages=messages, tools=[CALCULATOR], max_tokens=40)
    assert alone["choices"][0]["message"]["content"] is None
    first = await chat(client, messages=messages, tools=[CALCULATOR], parallel_tool_calls=False)
    assert len(first["choices"][0]["message"]["tool_calls"]) == 1


async def test_a_malformed_or_unwanted_tool_call_stays_text(
    scripted: tuple[ScriptedHost, httpx.AsyncClient],
) -> None:
    host, client = scripted
    broken = 'ok <tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>'
    call = '<tool_call>{"name": "calculator", "arguments": {}}</tool_call>'
    host.script += [broken, call, call]
    messages = [{"role": "user", "content": "hi"}]
    for body in ({"tools": [CALCULATOR]}, {"tools": [CALCULATOR], "tool_choice": "none"}, {}):
        answer = await chat(client, messages=messages, max_tokens=40, **body)
        [choice] = answer["choices"]
        assert choice["finish_reason"] == "stop"
        assert "tool_calls" not in choice["message"]
        assert choice["message"]["content"] in (broken, call)


BAD_BODIES: list[tuple[Any, str]] = [
    ({"messages": None}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "hello"}, "messages"),
    ({"messages": [{"content": "hi"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages"),
    ({"messages": [{"role": "user", "content": "what is 12 * 7? " * 300}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [5]}]},
     "messages[0].tool_calls[0]"),
    ({"tools": "calculator"}, "tools"),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools[0].function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"n": 0}, "n"),
    ({"n": True}, "n"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 100_000}, "max_tokens"),
    ({"max_completion_tokens": "8"}, "max_completion_tokens"),
    ({"stop": 5}, "stop"),
    ({"seed": 2**70}, "seed"),
    ({"stream": True}, "stream"),
    ({"logprobs": True}, "logprobs"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
]


async def test_malformed_requests_are_400_naming_the_field_and_the_engine_stays_up(
    client: httpx.AsyncClient,
) -> None:
    good = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for overrides, field in BAD_BODIES:
        response = await client.post("/v1/chat/completions", json={**good, **overrides})
        assert response.status_code == 400, (overrides, response.text)
        message = response.json()["error"]["message"]
        assert message.startswith(field + ":") or message.startswith(field + " "), (field, message)
    not_json = await client.post("/v1/chat/completions", content=b"{nope")
    assert not_json.status_code == 400
    assert (await client.get("/health")).status_code == 200
    assert (await chat(client, **good))["choices"][0]["message"]["role"] == "assistant"


async def test_a_snapshot_without_a_chat_template_is_refused_naming_messages(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    model_dir = await trio.to_thread.run_sync(make_tool_chat_model, tmp_path / "plain")
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    (model_dir / "chat_template.jinja").unlink(missing_ok=True)
    host = await trio.to_thread.run_sync(ModelHost, str(model_dir))
    async with await serve(host, nursery) as client:
        response = await client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        )
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("messages: ")
    assert "no chat template" in response.json()["error"]["message"]


FIELDS = ["messages", "tools", "tool_choice", "n", "temperature", "top_p", "max_tokens",
          "max_completion_tokens", "stop", "seed", "stream", "logprobs", "chat_template_kwargs",
          "parallel_tool_calls", "add_generation_prompt", "ignore_eos", "model"]
VALUES: list[Any] = [None, True, False, 0, -1, 1, 3, 2.5, 1e-300, 2**70, "x", "", "auto", "none",
                     [], {}, [1], ["a", 2], {"a": 1}, [{"role": "user", "content": "hi"}],
                     [{"role": "user"}], [{"role": "user", "content": [{"type": "text"}]}],
                     [{"role": "assistant", "content": None, "tool_calls": [{"function": "f"}]}],
                     [{"role": "tool", "content": "3"}], [CALCULATOR], [{"function": {"name": 1}}],
                     [{"role": "assistant", "content": "x", "tool_calls": [{"function": {
                         "name": "f", "arguments": "{not json"}}]}]]


async def test_random_bodies_are_answered_200_or_400_with_a_field_and_the_engine_stays_up(
    client: httpx.AsyncClient,
) -> None:
    import random

    rng = random.Random(0)
    statuses = set()
    for _ in range(150):
        body = {name: rng.choice(VALUES) for name in rng.sample(FIELDS, rng.randint(1, 6))}
        if rng.random() < 0.5:
            body.setdefault("messages", [{"role": "user", "content": "hi"}])
        if body.get("max_tokens") is None or rng.random() < 0.7:
            body["max_tokens"] = rng.choice([0, 1, 2])  # never the default: the whole context
        response = await client.post("/v1/chat/completions", json=body)
        statuses.add(response.status_code)
        assert response.status_code in (200, 400), (body, response.text)
        if response.status_code == 400:
            message = response.json()["error"]["message"]
            assert message.split(":")[0].split("[")[0].split(".")[0] in FIELDS, (body, message)
        else:
            assert response.json()["choices"][0]["message"]["role"] == "assistant"
    assert statuses == {200, 400}
    assert (await client.get("/health")).status_code == 200

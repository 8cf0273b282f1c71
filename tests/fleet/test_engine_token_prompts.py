"""The CPU engine's ``/v1/completions`` with prompts as token ids (how a chat prompt rendered by
its template is sent): taken as they are, no BOS added; a list of lists is a batch; ids out of
the vocabulary are a 400 naming the field; and ``top_k``, which chat evaluations send. In
process: the real ASGI app and the real tiny chat model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio
from transformers import PreTrainedTokenizerFast

from actorsys._errors import ConfigTypeError
from actorsys.fleet.clients.completions import complete
from actorsys.fleet.embedded.model import ModelHost
from actorsys.fleet.embedded.server import EmbeddedEngine
from tests.chat_models import make_chat_model

URL = "http://engine"


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_chat_model(tmp_path_factory.mktemp("chat-engine") / "model", seed=3)


@pytest.fixture
async def client(chat_model: Path, nursery: trio.Nursery) -> AsyncIterator[httpx.AsyncClient]:
    host = await trio.to_thread.run_sync(lambda: ModelHost(str(chat_model)))
    engine = EmbeddedEngine(host, max_batch=8)
    nursery.start_soon(engine.run)
    transport = httpx.ASGITransport(app=engine.app())
    async with httpx.AsyncClient(transport=transport, base_url=URL) as client:
        yield client
    engine.close()


async def texts(client: httpx.AsyncClient, **body: object) -> list[str]:
    response = await client.post("/v1/completions", json={"max_tokens": 6, "temperature": 0,
                                                          **body})
    assert response.status_code == 200, response.text
    return [choice["text"] for choice in response.json()["choices"]]


async def test_token_ids_are_taken_as_they_are_and_text_gets_the_tokenizers_bos(
    client: httpx.AsyncClient, chat_model: Path
) -> None:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(chat_model)
    chats = [f"<|bos|><|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
             for q in ("the quick brown fox", "what is two plus two?", "add 1 and 2")]
    once = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in chats]
    twice = [tokenizer(text)["input_ids"] for text in chats]
    assert twice == [[tokenizer.bos_token_id, *ids] for ids in once]
    from_ids = [answer for ids in once for answer in await texts(client, prompt=ids)]
    from_text = await texts(client, prompt=chats)
    assert from_text == await texts(client, prompt=twice)  # the engine's BOS, in front
    assert from_ids != from_text
    assert await texts(client, prompt=once) == from_ids  # a list of lists: a batch


@pytest.mark.parametrize(
    ("prompt", "field"),
    [([5, 10_000], "prompt: token ids must lie in"), ([[1, 2], [-1]], "prompt: token ids"),
     ([[1], "a"], "prompt: expected a list of token ids"), ([], "prompt: expected")],
)
async def test_bad_token_ids_are_a_400_naming_the_field(
    client: httpx.AsyncClient, prompt: object, field: str
) -> None:
    response = await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"].startswith(field)


async def test_top_k_one_samples_the_greedy_answer_and_a_bad_top_k_is_a_400(
    client: httpx.AsyncClient,
) -> None:
    prompt = [0, 5, 9, 12, 30]
    greedy = await texts(client, prompt=prompt)
    sampled = [await texts(client, prompt=prompt, temperature=1.5, top_k=1, seed=s)
               for s in range(3)]
    assert sampled == [greedy] * 3
    free = {tuple(await texts(client, prompt=prompt, temperature=1.5, top_k=-1, seed=s))
            for s in range(3)}
    assert free != {tuple(greedy)}
    response = await client.post("/v1/completions", json={"prompt": prompt, "top_k": 1.5})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("top_k: expected an integer")


async def test_the_completions_client_sends_token_ids_as_they_are() -> None:
    bodies: list[dict[str, object]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"text": "ok", "finish_reason": "stop"}]})

    answers = await complete([URL], ["plain text", (0, 5, 9)], max_tokens=2,
                             transport=httpx.MockTransport(answer))
    assert sorted(map(str, (b["prompt"] for b in bodies))) == ["[0, 5, 9]", "plain text"]
    assert [a.prompt for a in answers] == ["plain text", [0, 5, 9]]
    for bad in ([], [1.5], [True], [-1], None):
        with pytest.raises(ConfigTypeError, match=r"complete\(prompts\[0\]\)"):
            await complete([URL], [bad], transport=httpx.MockTransport(answer))  # type: ignore[list-item]

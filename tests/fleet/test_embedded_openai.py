"""What an OpenAI-style completions client (lm-evaluation-harness' ``local-completions``) asks
of the embedded engine: stop sequences, ``echo`` with ``logprobs``, prompts as token ids."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import trio
from transformers import LlamaConfig, PreTrainedTokenizerFast

from actorsys.fleet.model_load import load_causal_lm
from tests.fleet.conftest import TinyModels
from tests.fleet.test_embedded import completions, open_engine, texts
from tests.models import PROMPTS, greedy, random_model

CONTEXT, CONTINUATION = "the quick brown", " fox jumps over"


def transformers_logprobs(model_dir: Path, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1, from transformers' own forward pass."""
    model = load_causal_lm(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0]
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[i - 1, ids[i]]) for i in range(1, len(ids))]


def tied_gqa_model(tiny: TinyModels, directory: Path) -> Path:
    """A checkpoint with tied embeddings and grouped-query attention (4 heads, 2 KV heads)."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tiny.base)
    tokenizer.save_pretrained(directory)
    config = LlamaConfig.from_pretrained(tiny.base)
    config.hidden_size, config.intermediate_size = 128, 256
    config.num_attention_heads, config.num_key_value_heads = 4, 2
    config.tie_word_embeddings = True
    random_model(config, seed=5).save_pretrained(directory)
    return directory


@pytest.fixture
async def served(tiny: TinyModels, nursery: trio.Nursery) -> AsyncIterator[httpx.AsyncClient]:
    _, client = await open_engine(tiny.base, nursery)
    async with client:
        yield client


@pytest.fixture(params=["untied", "tied-gqa"])
async def model_dir(
    request: pytest.FixtureRequest, tiny: TinyModels, tmp_path: Path
) -> AsyncIterator[Path]:
    if request.param == "untied":
        yield tiny.step1
    else:
        yield await trio.to_thread.run_sync(tied_gqa_model, tiny, tmp_path / "tied")


async def test_echoed_logprobs_equal_transformers_for_text_and_token_id_prompts(
    model_dir: Path, nursery: trio.Nursery
) -> None:
    _, client = await open_engine(model_dir, nursery)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    ids = tokenizer(CONTEXT + CONTINUATION)["input_ids"]
    expected = await trio.to_thread.run_sync(transformers_logprobs, model_dir, ids)
    async with client:
        for prompt in (CONTEXT + CONTINUATION, ids):
            answer = await completions(
                client, prompt, max_tokens=0, echo=True, logprobs=1  # type: ignore[arg-type]
            )
            logprobs = answer["choices"][0]["logprobs"]
            assert logprobs["token_logprobs"][0] is None
            assert logprobs["token_logprobs"][1:] == pytest.approx(expected, abs=1e-4)
            assert logprobs["tokens"] == [tokenizer.decode([i]) for i in ids]
            assert answer["choices"][0]["text"] == CONTEXT + CONTINUATION


async def test_lm_eval_reads_the_log_likelihood_transformers_computes(
    tiny: TinyModels, nursery: trio.Nursery
) -> None:
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    _, client = await open_engine(tiny.step1, nursery)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tiny.step1)
    context = tokenizer(CONTEXT)["input_ids"]
    both = tokenizer(CONTEXT + CONTINUATION)["input_ids"]
    assert both[: len(context)] == context
    expected = await trio.to_thread.run_sync(transformers_logprobs, tiny.step1, both)
    others = [tokenizer(p)["input_ids"] for p in PROMPTS]
    async with client:
        # The body local-completions sends for log-likelihoods, several sequences batched.
        answer = await completions(
            client, [both, *others], max_tokens=1, echo=True, logprobs=1, seed=1234  # type: ignore[list-item]
        )
    [(loglikelihood, _)] = LocalCompletionsAPI.parse_logprobs(answer, ctxlens=[len(context)])
    assert loglikelihood == pytest.approx(sum(expected[len(context) - 1 :]), abs=1e-4)
    for choice, ids in zip(answer["choices"], [both, *others], strict=True):
        assert len(choice["logprobs"]["token_logprobs"]) == len(ids) + 1


async def test_greedy_flag_is_true_exactly_for_the_greedy_continuation(
    tiny: TinyModels, nursery: trio.Nursery
) -> None:
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    _, client = await open_engine(tiny.step1, nursery)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tiny.step1)
    [continuation] = await trio.to_thread.run_sync(greedy, tiny.step1, [CONTEXT], 3)
    context = tokenizer(CONTEXT)["input_ids"]
    greedy_ids = context + tokenizer(continuation)["input_ids"]
    other_ids = context + tokenizer(CONTINUATION)["input_ids"]
    assert greedy_ids != other_ids
    async with client:
        flags = []
        for ids in (greedy_ids, other_ids):
            answer = await completions(client, [ids], max_tokens=1, echo=True, logprobs=1)  # type: ignore[list-item]
            [(_, is_greedy)] = LocalCompletionsAPI.parse_logprobs(answer, ctxlens=[len(context)])
            flags.append(is_greedy)
    assert flags == [True, False]


async def test_generation_ends_at_a_stop_sequence_and_the_text_is_cut_before_it(
    served: httpx.AsyncClient, tiny: TinyModels
) -> None:
    full = await trio.to_thread.run_sync(greedy, tiny.base, PROMPTS, 16)
    stop = "o"
    answer = await completions(served, PROMPTS, max_tokens=16, stop=[stop, "never"])
    for choice, text in zip(answer["choices"], full, strict=True):
        if stop in text:
            assert choice["text"] == text.split(stop)[0]
            assert choice["finish_reason"] == "stop"
        else:
            assert choice["text"] == text
    assert any(stop in text for text in full)
    assert answer["usage"]["completion_tokens"] < 16 * len(PROMPTS)


async def test_generated_tokens_carry_their_logprobs_when_asked(served: httpx.AsyncClient) -> None:
    answer = await completions(served, PROMPTS[:1], max_tokens=4, logprobs=2)
    logprobs = answer["choices"][0]["logprobs"]
    assert len(logprobs["token_logprobs"]) == answer["usage"]["completion_tokens"]
    for value, top in zip(logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True):
        assert value == max(top.values())  # greedy: the chosen token is the most likely
    assert texts(await completions(served, PROMPTS[:1], max_tokens=4)) == [answer["choices"][0]["text"]]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "x", "logprobs": -1}, "logprobs"),
        ({"prompt": "x", "logprobs": True}, "logprobs"),
        ({"prompt": "x", "echo": "yes"}, "echo"),
        ({"prompt": "x", "stop": 3}, "stop"),
        ({"prompt": "x", "stop": ["a", None]}, "stop"),
    ],
)
async def test_bad_openai_fields_are_400_naming_the_field(
    served: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    response = await served.post("/v1/completions", json=body)
    assert response.status_code == 400
    assert field in response.json()["error"]["message"]

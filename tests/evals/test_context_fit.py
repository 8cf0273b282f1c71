"""Requests fitted to the model's context, and requests the server refuses (4xx): a short
context with miles' default ``max_tokens=256`` is scored, not skipped ``unhealthy``."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from actorsys import EvalSkip, RolloutFnEvalInput
from actorsys.evals import DatasetEval, EvalDataset
from actorsys.evals.data.context_fit import fit_datasets
from actorsys.evals.harnesses.sampling import evaluate_datasets
from actorsys.fleet.clients.completions import complete
from actorsys.fleet.local import LocalFleet, embedded
from tests.fakes import ScriptedFleet
from tests.models import make_model

POSITIONS = 256
LONG = "one two three four five six seven eight nine ten " * 40


@pytest.fixture(scope="module")
def short_context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama (and its tokenizer) with a context of 256 positions."""
    path = tmp_path_factory.mktemp("short-context") / "model"
    make_model(path)
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = POSITIONS
    (path / "config.json").write_text(json.dumps(config))
    return path


def records(*prompts: str) -> tuple[dict[str, str], ...]:
    return tuple({"prompt": prompt, "label": "x"} for prompt in prompts)


def test_max_tokens_is_cut_to_what_each_prompt_leaves(short_context: Path) -> None:
    dataset = EvalDataset(name="d", records=records("one two three", LONG))  # max_tokens=256
    [fits] = fit_datasets(str(short_context), [dataset]) or [[]]
    short, long = fits
    assert short.prompt_tokens > 0 and short.max_tokens == POSITIONS - short.prompt_tokens
    assert short.cut
    assert long.prompt_tokens > POSITIONS and long.max_tokens is None
    roomy = EvalDataset(name="r", records=records("one two three"), max_tokens=8)
    [[fit]] = fit_datasets(str(short_context), [roomy]) or [[]]
    assert (fit.max_tokens, fit.cut) == (8, False)


def test_a_checkpoint_without_config_or_tokenizer_is_not_fitted(tmp_path: Path) -> None:
    assert fit_datasets(str(tmp_path), [EvalDataset(name="d", records=records("p"))]) is None


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_default_max_tokens_on_a_short_context_is_cut_and_scored_on_the_real_engine(
    short_context: Path,
) -> None:
    dataset = EvalDataset(name="short", records=records("one two three", "engines load", LONG))
    async with LocalFleet.open([embedded(str(short_context))]) as local:
        output = await DatasetEval(dataset, request_timeout=120.0).evaluate_checkpoint(
            str(short_context), RolloutFnEvalInput(rollout_id=1, fleet=local.fleet)
        )
    metrics = output.metrics
    assert metrics is not None
    assert metrics["eval/short/errors"] == 1.0
    assert metrics["eval/short/truncated_ratio"] == 1.0
    samples = output.data["samples"]["short"]
    assert [bool(s["answer"]) for s in samples] == [True, True, False]
    assert "leaves no room to answer in the model's 256 positions" in samples[2]["error"]


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_requests_the_real_engine_refuses_skip_bad_request_with_its_message(
    short_context: Path,
) -> None:
    dataset = EvalDataset(name="short", records=records("one two three", "engines load"))
    async with LocalFleet.open([embedded(str(short_context))]) as local:
        with pytest.raises(EvalSkip) as caught:
            # Not fitted (no checkpoint): the engine answers every request 400.
            await evaluate_datasets(local.fleet, [dataset], concurrency=4, request_timeout=60.0,
                                    retries=2)
    assert caught.value.reason == "bad_request"
    assert "HTTP 400" in str(caught.value.detail)
    assert "exceeds the model's 256 positions" in str(caught.value.detail)


async def test_prompts_that_alone_fill_the_context_are_never_sent_and_skip_bad_request(
    short_context: Path,
) -> None:
    fleet = ScriptedFleet(lambda prompt, k: "x")
    dataset = EvalDataset(name="long", records=records(LONG, LONG))
    with pytest.raises(EvalSkip) as caught:
        await DatasetEval(dataset).evaluate_checkpoint(
            str(short_context), RolloutFnEvalInput(rollout_id=1, fleet=fleet)
        )
    assert caught.value.reason == "bad_request"
    assert "leaves no room" in str(caught.value.detail)
    assert fleet.calls == []


async def test_cut_requests_ask_each_for_its_own_max_tokens(short_context: Path) -> None:
    fleet = ScriptedFleet(lambda prompt, k: "x")
    dataset = EvalDataset(name="d", records=records("one two three", "a trainer hands over"),
                          max_tokens=252)
    output = await DatasetEval(dataset).evaluate_checkpoint(
        str(short_context), RolloutFnEvalInput(rollout_id=1, fleet=fleet)
    )
    [fits] = fit_datasets(str(short_context), [dataset]) or [[]]
    assert fleet.calls[0]["max_tokens"] == [fit.max_tokens for fit in fits]
    assert output.metrics is not None
    assert output.metrics["eval/d/truncated_ratio"] == sum(f.cut for f in fits) / 2


async def test_a_4xx_is_never_retried_and_a_429_is() -> None:
    sent: list[str] = []

    def server(request: httpx.Request) -> httpx.Response:
        prompt = json.loads(request.content)["prompt"]
        sent.append(prompt)
        if prompt == "bad":
            return httpx.Response(400, json={"error": "prompt: too long"})
        if prompt == "busy" and sent.count("busy") == 1:
            return httpx.Response(429, json={"error": "slow down"})
        return httpx.Response(200, json={"choices": [{"text": "ok", "finish_reason": "stop"}]})

    answers = await complete(["http://engine"], ["bad", "busy"], model="m", retries=3,
                             keep_failures=True, transport=httpx.MockTransport(server))
    bad, busy = answers
    assert bad.bad_request and "HTTP 400" in (bad.error or "")
    assert (busy.text, busy.error) == ("ok", None)
    assert sent.count("bad") == 1 and sent.count("busy") == 2

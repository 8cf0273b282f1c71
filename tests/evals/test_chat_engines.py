"""Chat datasets on the real CPU engine: every answer is what transformers generates greedily
from ``apply_chat_template(..., tokenize=True)`` (a string prompt, a system message, tools, a
multi-turn history with a tool call, ``enable_thinking`` off), with a template that begins with
the BOS and a tokenizer that adds one to plain text; a second BOS would change the answers
(so these tests would catch one); a snapshot without a chat template skips its point. One
engine process serves the module: each test pins it to what it evaluates."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from actorsys import EvalConfig, EvalSupervisor, Fleet, MemorySink, SGLangEngine
from actorsys.evals import DatasetEval, ServerEvalFn
from actorsys.fleet.local import new_api_key
from tests.chat_models import CONVERSATIONS, without_chat_template
from tests.engine_process import engine_process
from tests.evals.conftest import CHAT_TOKENS, ChatSet

# One engine process for the module: its tests share one worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("evals/test_chat_engines")]


def config(tmp_path: Path, chat_set: ChatSet) -> EvalConfig:
    return EvalConfig(hf_dir=tmp_path / "staging", base_checkpoint=chat_set.model,
                      pin_timeout=60.0, eval_timeout=120.0, close_timeout=10.0)


KEY = new_api_key()


@pytest.fixture(scope="module")
def engine_url(chat_set: ChatSet) -> Iterator[str]:
    """A CPU engine process serving the chat model (pinned by each test), answering to KEY."""
    with engine_process(["--model", str(chat_set.model)], key=KEY) as url:
        yield url


def test_a_second_bos_changes_the_answers_of_the_chat_model(chat_set: ChatSet) -> None:
    for name in ("thinking", "direct"):
        differ = sum(a != b for a, b in zip(chat_set.expected[name], chat_set.double_bos[name],
                                            strict=True))
        assert differ >= 2, (name, chat_set.double_bos[name])


@pytest.mark.timeout(240)
async def test_cpu_engine_answers_every_chat_prompt_as_transformers_does(
    chat_set: ChatSet, engine_url: str, tmp_path: Path
) -> None:
    sink = MemorySink()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(chat_set.model)
    fleet = Fleet([SGLangEngine(engine_url, api_key=KEY)])
    evaluation = DatasetEval(chat_set.datasets(scorer="exact"), concurrency=4,
                             request_timeout=60.0)
    async with EvalSupervisor.open(config(tmp_path, chat_set), eval_fn=evaluation,
                                   fleet=fleet, sink=sink) as sup:
        await sup.submit(1, checkpoint_dir=chat_set.model)
        assert (await sup.drain(timeout=180)).pending == []
    # The hazard the token ids avoid: the rendered text sent as a plain prompt gets the
    # engine tokenizer's own BOS in front of the template's.
    samples = sink.by_step()[1].data["samples"]
    texts = [s["prompt"] for s in samples["direct"]]
    plain = await fleet.complete(texts, max_tokens=CHAT_TOKENS, check_version=False)
    outcome = sink.by_step()[1]
    assert outcome.status == "ok", (outcome.reason, outcome.data)
    for name in ("thinking", "direct"):
        answers = [s["answer"] for s in outcome.data["samples"][name]]
        assert answers == chat_set.expected[name]
        assert outcome.metrics[f"eval/{name}"] == 1.0
    for sample, conversation in zip(samples["direct"], CONVERSATIONS, strict=True):
        messages = conversation["messages"]
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        assert sample["prompt"] == tokenizer.apply_chat_template(
            messages, tools=conversation.get("tools"), add_generation_prompt=True,
            tokenize=False, enable_thinking=False)
        assert sample["prompt"].startswith("<|bos|><|im_start|>")
    assert [a.text for a in plain] == chat_set.double_bos["direct"]


@pytest.mark.timeout(240)
async def test_a_snapshot_without_a_chat_template_skips_naming_it_and_plain_sets_still_score(
    chat_set: ChatSet, engine_url: str, tmp_path: Path
) -> None:
    bare = without_chat_template(chat_set.model, tmp_path / "bare")
    sink = MemorySink()
    evaluation = ServerEvalFn(chat_set.datasets(scorer="exact"), url=engine_url, api_key=KEY,
                              request_timeout=60.0, pin_timeout=60.0)
    try:
        async with EvalSupervisor.open(config(tmp_path, chat_set), eval_fn=evaluation,
                                       sink=sink) as sup:
            await sup.submit(1, checkpoint_dir=bare)
            await sup.submit(2, checkpoint_dir=chat_set.model)
            assert (await sup.drain(timeout=200)).pending == []
    finally:
        await evaluation.dispose()
    skipped, scored = sink.by_step()[1], sink.by_step()[2]
    assert (skipped.status, skipped.reason) == ("skipped", "no_chat_template")
    assert str(bare) in json.dumps(skipped.data), skipped.data
    assert scored.status == "ok", (scored.reason, scored.data)
    assert scored.metrics["eval/thinking"] == scored.metrics["eval/direct"] == 1.0

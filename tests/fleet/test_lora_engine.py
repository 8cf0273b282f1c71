"""A LoRA model submitted as it trains is served by a real CPU engine process as the merged
model: the engine's log-probabilities are the merged model's, point after point."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import PreTrainedTokenizerFast

from actorsys import (
    CheckpointEvalFn,
    EvalConfig,
    EvalSupervisor,
    MemorySink,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from actorsys.fleet.local import LocalFleet, embedded
from actorsys.fleet.model_load import load_causal_lm
from tests.fleet.conftest import TinyModels

TEXT = "the trainer hands over a snapshot and goes on training"


class EchoLogprobs(CheckpointEvalFn):
    """Asks the pinned engine for the log-probability of every token of ``ids``."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    async def evaluate_checkpoint(
        self, checkpoint_dir: str, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        assert input.fleet is not None
        body = {"prompt": [self.ids], "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0.0}
        headers = {"Authorization": f"Bearer {input.fleet.api_key}"}
        async with httpx.AsyncClient(timeout=60.0, headers=headers) as client:
            response = await client.post(f"{input.fleet.urls[0]}/v1/completions", json=body)
        response.raise_for_status()
        logprobs = response.json()["choices"][0]["logprobs"]["token_logprobs"]
        return RolloutFnEvalOutput(data={"logprobs": logprobs})


def merged_logprobs(peft_model: Any, ids: list[int]) -> list[float]:
    merged = copy.deepcopy(peft_model).merge_and_unload().eval()
    with torch.no_grad():
        out = torch.log_softmax(merged(torch.tensor([ids])).logits[0].float(), dim=-1)
    return [float(out[i - 1, ids[i]]) for i in range(1, len(ids))]


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_engine_process_serves_the_merged_model_of_each_point(tiny: TinyModels, tmp_path):
    base = load_causal_lm(str(tiny.base), dtype=torch.float32)
    adapters = LoraConfig(r=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(base, adapters)
    ids = PreTrainedTokenizerFast.from_pretrained(tiny.base)(TEXT)["input_ids"]
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    sink = MemorySink()
    expected = {}
    config = EvalConfig(
        hf_dir=tmp_path / "hf", base_checkpoint=tiny.base, pin_timeout=60.0, eval_timeout=120.0
    )
    async with LocalFleet.open([embedded(str(tiny.base))]) as local:
        async with EvalSupervisor.open(
            config, eval_fn=EchoLogprobs(ids), fleet=local.fleet, sink=sink
        ) as sup:
            for step in (1, 2):
                expected[step] = merged_logprobs(model, ids)
                assert await sup.submit(step, model=model)
                model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            report = await sup.drain(timeout=180)

    assert report.pending == []
    assert expected[1] != pytest.approx(expected[2], abs=1e-3)
    for step in (1, 2):
        outcome = sink.by_step()[step]
        assert outcome.ok, (outcome.reason, outcome.data)
        assert outcome.data["logprobs"][0] is None
        assert outcome.data["logprobs"][1:] == pytest.approx(expected[step], abs=1e-4)

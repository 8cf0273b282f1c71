"""peft LoRA models are exported as the merged model: what ``merge_and_unload()`` of a copy
followed by ``save_pretrained`` writes, loaded back by transformers, through the pipeline."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import pytest
import torch
from peft import IA3Config, LoraConfig, get_peft_model
from safetensors.torch import load_file

from actorsys import (
    CheckpointEvalFn,
    ConfigError,
    EvalConfig,
    EvalSupervisor,
    MemorySink,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
    UnsupportedModelError,
)
from actorsys.snapshot import BufferPool, capture, plan_state, write_snapshot

from .snapshot_models import input_ids, load, logits, tiny_llama

DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
TIED = pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])


def lora(base: torch.nn.Module, **options: Any) -> Any:
    settings: dict[str, Any] = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
    return get_peft_model(base, LoraConfig(**{**settings, **options}))


def train_step(model: torch.nn.Module, ids: torch.Tensor) -> None:
    """One optimizer step on what trains (the adapters)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=0.5)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def merged_reference(peft_model: Any, directory: str) -> dict[str, torch.Tensor]:
    """What ``merge_and_unload().save_pretrained()`` of a copy of the model writes."""
    copy.deepcopy(peft_model).merge_and_unload().save_pretrained(directory)
    return load_file(os.path.join(directory, "model.safetensors"))


def written(directory: str) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(directory, "model.safetensors"))


def snapshot(source: Any, directory: str, pool: BufferPool | None = None) -> str:
    lease = None
    if pool is not None:
        lease = pool.try_lease(plan_state(source).buffer_nbytes, pinned=False)
    weights = capture(source, buffers=lease)
    os.makedirs(directory, exist_ok=True)
    write_snapshot(weights, directory)
    weights.release()
    return directory


def assert_same_tensors(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Same keys and dtypes; values equal within the dtype's rounding."""
    assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        assert actual[name].dtype == tensor.dtype, name
        torch.testing.assert_close(actual[name], tensor, msg=name)


@DTYPES
@TIED
def test_snapshot_is_the_merged_model_save_pretrained_writes(tmp_path, dtype, tied):
    model = lora(tiny_llama(dtype=dtype, tied=tied))
    ids = input_ids()
    train_step(model, ids)

    path = snapshot(model, str(tmp_path / "snap"), BufferPool(2))

    expected = merged_reference(model, str(tmp_path / "reference"))
    assert_same_tensors(written(path), expected)
    assert ("lm_head.weight" in expected) is not tied
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["dtype"] == str(dtype).removeprefix("torch.")
    loaded = load(path)
    reference = copy.deepcopy(model).merge_and_unload()
    torch.testing.assert_close(logits(loaded, ids), logits(reference, ids))
    assert not torch.equal(logits(loaded, ids), logits(tiny_llama(dtype=dtype, tied=tied), ids))


@pytest.mark.parametrize(
    "options",
    [
        {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "rank_pattern": {"o_proj": 4},
         "alpha_pattern": {"k_proj": 64}, "use_rslora": True},
        {"target_modules": ["embed_tokens", "gate_proj"]},
        {"target_modules": ["q_proj"], "modules_to_save": ["lm_head"]},
        {"target_modules": ["v_proj"], "lora_bias": True, "bias": "none"},
    ],
    ids=["patterns-rslora", "embedding", "modules-to-save", "lora-bias"],
)
def test_every_supported_lora_layout_merges_as_peft_merges_it(tmp_path, options):
    base = tiny_llama(tied=False)
    if options.get("lora_bias"):
        base.model.layers[0].self_attn.v_proj.bias = torch.nn.Parameter(torch.randn(32) * 0.1)
        base.model.layers[0].self_attn.v_proj.bias.requires_grad_(False)
        options = {**options, "target_modules": ["layers.0.self_attn.v_proj"]}
    model = lora(base, init_lora_weights=False, **options)

    path = snapshot(model, str(tmp_path / "snap"), BufferPool(1))

    assert_same_tensors(written(path), merged_reference(model, str(tmp_path / "reference")))


def test_only_the_active_adapter_is_merged(tmp_path):
    model = lora(tiny_llama(tied=False), init_lora_weights=False)
    model.add_adapter("second", LoraConfig(r=4, target_modules=["v_proj", "o_proj"], init_lora_weights=False))
    pool = BufferPool(1)
    first = written(snapshot(model, str(tmp_path / "default"), pool))

    model.set_adapter("second")
    second = written(snapshot(model, str(tmp_path / "second"), pool))

    assert_same_tensors(second, merged_reference(model, str(tmp_path / "reference")))
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(first[q], second[q])


def test_adapters_peft_merged_into_the_base_already_are_not_added_twice(tmp_path):
    model = lora(tiny_llama(tied=False), init_lora_weights=False)
    expected = merged_reference(model, str(tmp_path / "reference"))
    pool = BufferPool(1)
    snapshot(model, str(tmp_path / "before"), pool)

    model.merge_adapter()
    path = snapshot(model, str(tmp_path / "snap"), pool)

    assert_same_tensors(written(path), expected)


def test_trained_adapters_and_in_place_changes_of_frozen_tensors_reach_the_next_snapshot(tmp_path):
    model = lora(tiny_llama(tied=True))
    ids = input_ids()
    pool = BufferPool(2)
    base_nbytes = sum(
        t.numel() * t.element_size() for t in copy.deepcopy(model).merge_and_unload().state_dict().values()
    ) - model.base_model.model.lm_head.weight.numel() * 4

    first = snapshot(model, str(tmp_path / "1"), pool)
    assert pool.statistics().kept_copied_nbytes == base_nbytes
    train_step(model, ids)
    second = snapshot(model, str(tmp_path / "2"), pool)
    assert pool.statistics().kept_copied_nbytes == base_nbytes
    frozen = model.base_model.model.model.layers[1].mlp.up_proj.weight
    with torch.no_grad():
        frozen.add_(0.25)
    third = snapshot(model, str(tmp_path / "3"), pool)

    assert pool.statistics().kept_copied_nbytes == base_nbytes + frozen.numel() * 4
    assert_same_tensors(written(third), merged_reference(model, str(tmp_path / "reference")))
    first_weights, second_weights, third_weights = written(first), written(second), written(third)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(first_weights[q], second_weights[q])
    up = "model.layers.1.mlp.up_proj.weight"
    assert torch.equal(first_weights[up], second_weights[up])
    torch.testing.assert_close(third_weights[up], second_weights[up] + 0.25)


def test_a_frozen_tensor_changed_while_an_export_reads_the_base_is_copied_aside(tmp_path):
    model = lora(tiny_llama(tied=False))
    pool = BufferPool(2)
    up = "model.layers.1.mlp.up_proj.weight"
    reading = capture(model, buffers=pool.try_lease(plan_state(model).buffer_nbytes, pinned=False))
    before = reading.tensors[up].clone()
    with torch.no_grad():
        model.base_model.model.model.layers[1].mlp.up_proj.weight.mul_(2)

    changed = snapshot(model, str(tmp_path / "changed"), pool)

    assert torch.equal(reading.tensors[up], before)
    torch.testing.assert_close(written(changed)[up], before * 2)
    reading.release()


class LoadAndScore(CheckpointEvalFn):
    runtime = "thread"

    def evaluate_checkpoint(
        self, checkpoint_dir: str, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        return RolloutFnEvalOutput(data={"logits": logits(load(checkpoint_dir), input_ids())})


@pytest.mark.timeout(90)
@DTYPES
async def test_prepared_supervisor_copies_the_base_once_and_points_score_the_merged_model(
    tmp_path, dtype
):
    model = lora(tiny_llama(dtype=dtype, tied=False))
    ids = input_ids()
    sink = MemorySink()
    expected = {}
    config = EvalConfig(hf_dir=tmp_path / "hf", max_in_flight=2)
    async with EvalSupervisor.open(config, eval_fn=LoadAndScore(), sink=sink) as sup:
        prepared = await sup.prepare(model=model)
        for step in (1, 2, 3):
            train_step(model, ids)
            expected[step] = logits(copy.deepcopy(model).merge_and_unload(), ids)
            assert await sup.submit(step, model=model)
        await sup.drain()
        stats = sup.statistics().buffers

    assert prepared.kept == 1 and prepared.sets == 2 and prepared.prepared == 2
    assert stats.kept_copied_nbytes == prepared.kept_copied_nbytes == prepared.kept_nbytes
    assert stats.sets <= 2 and stats.allocations == 0
    for step in (1, 2, 3):
        outcome = sink.by_step()[step]
        assert outcome.ok, outcome
        torch.testing.assert_close(outcome.data["logits"], expected[step])


@pytest.mark.parametrize(
    ("make", "form"),
    [
        (lambda: lora(tiny_llama(), use_dora=True), "DoRA"),
        (lambda: get_peft_model(tiny_llama(), IA3Config(target_modules=["q_proj"], feedforward_modules=[])),
         "IA3"),
    ],
    ids=["dora", "ia3"],
)
async def test_unmergeable_adapters_raise_at_submit_and_a_plain_model_submits_after(tmp_path, make, form):
    sink = MemorySink()
    async with EvalSupervisor.open(
        EvalConfig(hf_dir=tmp_path / "hf"), eval_fn=LoadAndScore(), sink=sink
    ) as sup:
        with pytest.raises(UnsupportedModelError, match=form) as raised:
            await sup.submit(1, model=make())
        with pytest.raises(UnsupportedModelError):
            await sup.prepare(model=make())
        assert await sup.submit(1, model=tiny_llama())
        await sup.drain()

    assert isinstance(raised.value, ConfigError)
    assert "export=" in str(raised.value)
    assert sink.by_step()[1].ok


@pytest.mark.timeout(90)
def test_a_sync_trainer_submits_its_peft_model_through_the_bridge(tmp_path):
    from bridge import EvalBridge

    model = lora(tiny_llama(tied=True))
    ids = input_ids()
    sink = MemorySink()
    expected = {}
    with EvalBridge(EvalConfig(hf_dir=tmp_path / "hf"), eval_fn=LoadAndScore(), sink=sink) as bridge:
        stats = bridge.prepare(model=model)
        for step in (1, 2):
            train_step(model, ids)
            expected[step] = logits(copy.deepcopy(model).merge_and_unload(), ids)
            assert bridge.submit(step, model=model)
        bridge.drain(timeout=60)

    assert stats.kept == 1
    for step in (1, 2):
        assert sink.by_step()[step].ok
        torch.testing.assert_close(sink.by_step()[step].data["logits"], expected[step])

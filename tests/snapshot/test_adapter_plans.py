"""A peft model's plan is made once and reused while the model keeps its form: a second
submit of the same model plans nothing, and any change of what the plan read (adapters added,
removed, resized, switched, merged, scaled, cast; a weight unfrozen) gets a new plan whose
snapshot is still the merged model."""

from __future__ import annotations

import copy
import gc
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
from peft import LoraConfig

from actorsys import EvalConfig, EvalSupervisor, MemorySink
from actorsys.snapshot import BufferPool, plan_state
from actorsys.snapshot._adapters import plan as adapters_module

from .snapshot_models import input_ids, load, logits, tiny_llama, tiny_mixtral
from .test_adapters import (
    LoadAndScore,
    assert_same_tensors,
    lora,
    merged_reference,
    snapshot,
    train_step,
    written,
)

Q_PROJ = "model.layers.0.self_attn.q_proj"


def two_adapters() -> Any:
    """A LoRA model whose ``default`` adapter is active, with a second one, ``other``."""
    model = lora(tiny_llama(tied=False), init_lora_weights=False)
    model.add_adapter("other", LoraConfig(r=4, target_modules=["v_proj", "o_proj"], init_lora_weights=False))
    return model


def layer(model: Any, name: str = Q_PROJ) -> Any:
    return model.base_model.model.get_submodule(name)


def resize_replacing(model: Any) -> None:
    q = layer(model)
    q.lora_A["default"].weight = torch.nn.Parameter(torch.randn(12, q.in_features))
    q.lora_B["default"].weight = torch.nn.Parameter(torch.randn(q.out_features, 12))


def resize_through_data(model: Any) -> None:
    q = layer(model)
    q.lora_A["default"].weight.data = torch.randn(12, q.in_features)
    q.lora_B["default"].weight.data = torch.randn(q.out_features, 12)


def add_third(model: Any) -> None:
    model.add_adapter("third", LoraConfig(r=2, target_modules=["k_proj"], init_lora_weights=False))
    model.set_adapter("third")


def remove_other(model: Any) -> None:
    model.delete_adapter("other")


def unfreeze(model: Any) -> None:
    layer(model, "model.layers.1.mlp.up_proj").weight.requires_grad_(True)


CHANGES: dict[str, Callable[[Any], None]] = {
    "switch": lambda model: model.set_adapter("other"),
    "add": add_third,
    "add-inactive": lambda model: model.add_adapter("idle", LoraConfig(r=2, target_modules=["q_proj"])),
    "remove": remove_other,
    "resize-replacing": resize_replacing,
    "resize-through-data": resize_through_data,
    "merge": lambda model: model.merge_adapter(),
    "scale": lambda model: layer(model).scale_layer(3.0),
    "cast": lambda model: model.to(torch.bfloat16),
    "unfreeze": unfreeze,
}


def test_a_second_plan_of_the_same_model_is_the_first_one_after_a_training_step(tmp_path):
    model = lora(tiny_llama(tied=True))
    first = plan_state(model)
    train_step(model, input_ids())

    second = plan_state(model)

    assert second.entries is first.entries
    assert second.adapters is not None and first.adapters is not None
    assert second.adapters.outputs is first.adapters.outputs
    assert second.model is model.base_model.model
    path = snapshot(model, str(tmp_path / "snap"), BufferPool(1))
    assert_same_tensors(written(path), merged_reference(model, str(tmp_path / "reference")))


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_a_changed_model_is_planned_again_and_its_snapshot_is_the_merged_model(tmp_path, change):
    model = two_adapters()
    pool = BufferPool(1)
    snapshot(model, str(tmp_path / "before"), pool)
    before = plan_state(model)

    change(model)
    after = plan_state(model)
    path = snapshot(model, str(tmp_path / "after"), pool)

    assert after.entries is not before.entries
    assert plan_state(model).entries is after.entries
    reference = str(tmp_path / "reference")
    assert_same_tensors(written(path), merged_reference(model, reference))
    ids = input_ids()
    torch.testing.assert_close(logits(load(path), ids), logits(load(reference), ids))


def test_a_reused_plan_of_a_model_whose_weights_transformers_converts_writes_them_back(tmp_path):
    model = lora(tiny_mixtral(), target_modules=["q_proj"], init_lora_weights=False)
    pool = BufferPool(1)
    first = written(snapshot(model, str(tmp_path / "first"), pool))
    train_step(model, input_ids())

    second = written(snapshot(model, str(tmp_path / "second"), pool))

    assert plan_state(model).entries is plan_state(model).entries
    expected = merged_reference(model, str(tmp_path / "reference"))
    assert_same_tensors(second, expected)
    assert sorted(first) == sorted(expected)


def test_an_unfrozen_weight_is_copied_at_every_point_once_planned_again(tmp_path):
    model = two_adapters()
    up = "model.layers.1.mlp.up_proj.weight"
    assert up not in plan_state(model).entries

    unfreeze(model)

    assert up in plan_state(model).entries


def test_a_model_with_a_state_dict_hook_is_planned_at_every_submit(tmp_path):
    model = lora(tiny_llama(tied=False))
    model.base_model.model.lm_head.register_state_dict_post_hook(lambda *args: None)

    first = plan_state(model)

    assert plan_state(model).entries is not first.entries
    path = snapshot(model, str(tmp_path / "snap"), BufferPool(1))
    assert_same_tensors(written(path), merged_reference(model, str(tmp_path / "reference")))


def test_a_kept_plan_does_not_keep_its_model_alive():
    model = lora(tiny_llama(tied=False))
    plan_state(model)
    assert plan_state(model).entries is plan_state(model).entries
    base = weakref.ref(model.base_model.model)

    del model
    gc.collect()

    assert base() is None


@pytest.mark.timeout(90)
async def test_submits_of_the_same_model_plan_once_and_score_the_merged_model(tmp_path, monkeypatch):
    planned: list[object] = []
    plan = adapters_module._plan

    def counting(model: torch.nn.Module) -> Any:
        planned.append(model)
        return plan(model)

    monkeypatch.setattr(adapters_module, "_plan", counting)
    model = lora(tiny_llama(tied=False))
    ids = input_ids()
    sink = MemorySink()
    expected = {}
    async with EvalSupervisor.open(
        EvalConfig(hf_dir=tmp_path / "hf", max_in_flight=2), eval_fn=LoadAndScore(), sink=sink
    ) as sup:
        for step in (1, 2, 3):
            train_step(model, ids)
            expected[step] = logits(copy.deepcopy(model).merge_and_unload(), ids)
            assert await sup.submit(step, model=model)
        await sup.drain()

    assert planned == [model.base_model.model]
    for step in (1, 2, 3):
        outcome = sink.by_step()[step]
        assert outcome.ok, outcome
        torch.testing.assert_close(outcome.data["logits"], expected[step])

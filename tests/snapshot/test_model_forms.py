"""The forms a trainer's model comes in: wrappers are unwrapped to the inner model's keys, and
forms whose weights cannot be copied as they are raise UnsupportedModelError at submit."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file

from actorsys import EvalConfig, EvalSupervisor, MemorySink, UnsupportedModelError
from actorsys.snapshot import capture, plan_state, write_snapshot
from actorsys.snapshot._forms import ModelForm, model_form

from .snapshot_models import tiny_llama
from .test_adapters import LoadAndScore


@pytest.fixture(scope="module")
def process_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A one-process gloo group, as DDP and FSDP need."""
    store = tmp_path_factory.mktemp("group") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def lora(base: torch.nn.Module) -> Any:
    return get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))


def written_keys(source: Any, directory: str) -> list[str]:
    weights = capture(source)
    os.makedirs(directory, exist_ok=True)
    write_snapshot(weights, directory)
    weights.release()
    return sorted(load_file(os.path.join(directory, "model.safetensors")))


def merged_keys(peft_model: Any, directory: str) -> list[str]:
    """The keys ``merge_and_unload().save_pretrained()`` of a copy writes."""
    copy.deepcopy(peft_model).merge_and_unload().save_pretrained(directory)
    return sorted(load_file(os.path.join(directory, "model.safetensors")))


def test_compiled_models_and_compiled_blocks_export_the_inner_keys(tmp_path):
    from accelerate.utils import compile_regions

    model = tiny_llama(tied=False)
    expected = sorted(model.state_dict())

    assert written_keys(torch.compile(model), str(tmp_path / "whole")) == expected
    assert written_keys(compile_regions(model), str(tmp_path / "regions")) == expected


def test_a_compiled_peft_model_exports_the_merged_keys(tmp_path):
    model = lora(tiny_llama(tied=True))
    expected = merged_keys(model, str(tmp_path / "reference"))

    assert written_keys(torch.compile(model), str(tmp_path / "snap")) == expected


def test_ddp_around_a_model_or_a_peft_model_exports_the_inner_keys(tmp_path, process_group):
    from torch.nn.parallel import DistributedDataParallel

    plain, adapted = tiny_llama(tied=False), lora(tiny_llama(tied=False))

    assert written_keys(DistributedDataParallel(plain), str(tmp_path / "plain")) == sorted(
        plain.state_dict()
    )
    assert written_keys(DistributedDataParallel(adapted), str(tmp_path / "peft")) == merged_keys(
        adapted, str(tmp_path / "reference")
    )


def test_a_model_accelerate_prepared_exports_its_own_keys(tmp_path):
    from accelerate import Accelerator

    model = lora(tiny_llama(tied=False))
    prepared = Accelerator(cpu=True).prepare(model)

    assert written_keys(prepared, str(tmp_path / "snap")) == merged_keys(model, str(tmp_path / "reference"))


def test_fsdp2_parameters_are_left_to_the_sharded_path(process_group):
    from torch.distributed.fsdp import fully_shard

    model = tiny_llama(tied=False)
    fully_shard(model)

    assert model_form(model) is ModelForm.SHARDED


async def test_fsdp1_raises_unsupported_at_submit_and_a_plain_submit_works_after(tmp_path, process_group):
    from torch.distributed.fsdp import FullyShardedDataParallel

    wrapped = FullyShardedDataParallel(tiny_llama(tied=False), device_id=torch.device("cpu"))
    sink = MemorySink()
    async with EvalSupervisor.open(
        EvalConfig(hf_dir=tmp_path / "hf"), eval_fn=LoadAndScore(), sink=sink
    ) as sup:
        with pytest.raises(UnsupportedModelError, match="FSDP1") as raised:
            await sup.submit(1, model=wrapped)
        assert await sup.submit(1, model=tiny_llama())
        await sup.drain()

    assert raised.value.form == "fsdp1" and "export=" in str(raised.value)
    assert sink.by_step()[1].ok
    with pytest.raises(UnsupportedModelError):
        plan_state(wrapped)


async def test_quantized_bases_raise_unsupported_at_submit_with_or_without_adapters(tmp_path):
    # torchao is no dependency: once installed, transformers imports it in every process
    # that builds a model. The test runs wherever it is installed.
    quantization = pytest.importorskip("torchao.quantization")
    quantized = tiny_llama(tied=False)
    quantization.quantize_(quantized, quantization.Int8WeightOnlyConfig())
    adapted = tiny_llama(tied=False)
    quantization.quantize_(adapted, quantization.Int8WeightOnlyConfig())
    adapted = lora(adapted)
    sink = MemorySink()
    async with EvalSupervisor.open(
        EvalConfig(hf_dir=tmp_path / "hf"), eval_fn=LoadAndScore(), sink=sink
    ) as sup:
        for model in (quantized, adapted):
            with pytest.raises(UnsupportedModelError, match="quantized") as raised:
                await sup.submit(1, model=model)
            assert raised.value.form == "quantized"
        assert await sup.submit(1, model=tiny_llama())
        await sup.drain()

    assert sink.by_step()[1].ok

"""Capturing real torch models and writing them as HF checkpoints transformers loads back."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, GenerationConfig

from actorsys.snapshot import capture, plan_state, weights_nbytes, write_snapshot
from actorsys.snapshot._write.safetensors import DTYPE_NAMES, write_file

from .snapshot_models import (
    CHAT_TEMPLATE,
    LINES,
    input_ids,
    load,
    logits,
    make_base_checkpoint,
    tiny_llama,
    tiny_mixtral,
)


def snapshot_of(source: object, directory: str, **kwargs: object) -> str:
    weights = capture(source)  # type: ignore[arg-type]
    os.makedirs(directory, exist_ok=True)
    write_snapshot(weights, directory, **kwargs)  # type: ignore[arg-type]
    weights.release()
    return directory


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_round_trip_gives_bitwise_identical_logits(tmp_path, dtype, tied):
    model = tiny_llama(dtype=dtype, tied=tied)
    ids = input_ids()
    expected = logits(model, ids)

    loaded = load(snapshot_of(model, str(tmp_path / "snap")))

    actual = logits(loaded, ids)
    assert actual.dtype == dtype
    assert torch.equal(actual, expected)


def test_tied_embeddings_are_written_once_and_tied_again_on_load(tmp_path):
    model = tiny_llama(tied=True)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    path = snapshot_of(model, str(tmp_path / "snap"))

    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.embed_tokens.weight" in keys
    assert "lm_head.weight" not in keys
    loaded = load(path)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    written = load_file(os.path.join(path, "model.safetensors"))
    assert weights_nbytes(model) == sum(t.numel() * t.element_size() for t in written.values())


@pytest.mark.parametrize(
    ("make", "max_shard_size"),
    [
        (lambda: tiny_llama(tied=True), 5 * 1000**3),
        (lambda: tiny_llama(tied=True), 150_000),
        (lambda: tiny_llama(dtype=torch.bfloat16, tied=False), 100_000),
        (tiny_mixtral, 5 * 1000**3),
    ],
    ids=["llama-one-file", "llama-sharded", "llama-bf16-sharded", "mixtral-experts-reverted"],
)
def test_snapshot_is_byte_identical_to_save_pretrained(tmp_path, make, max_shard_size):
    model = make()
    ours = snapshot_of(model, str(tmp_path / "ours"), max_shard_size=max_shard_size)
    theirs = str(tmp_path / "theirs")
    model.save_pretrained(theirs, max_shard_size=max_shard_size)

    assert sorted(os.listdir(ours)) == sorted(os.listdir(theirs))
    for name in os.listdir(theirs):
        with open(os.path.join(ours, name), "rb") as a, open(os.path.join(theirs, name), "rb") as b:
            assert a.read() == b.read(), name
    if max_shard_size < 1000**3:
        assert "model.safetensors.index.json" in os.listdir(ours)


def test_sharded_snapshot_loads_with_identical_logits(tmp_path):
    model = tiny_llama(dtype=torch.bfloat16, tied=True)
    ids = input_ids()

    path = snapshot_of(model, str(tmp_path / "snap"), max_shard_size=60_000)

    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        index = json.load(f)
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2
    assert shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert torch.equal(logits(load(path), ids), logits(model, ids))


def test_capture_leaves_the_trainers_config_alone(tmp_path):
    model = tiny_llama()
    before = model.config.to_dict()

    path = snapshot_of(model, str(tmp_path / "snap"))

    assert model.config.to_dict() == before
    with open(os.path.join(path, "config.json")) as f:
        written = json.load(f)
    assert written["architectures"] == ["LlamaForCausalLM"]
    assert written["dtype"] == "float32"


def test_weights_changed_after_capture_do_not_reach_the_snapshot(tmp_path):
    model = tiny_llama()
    ids = input_ids()
    expected = logits(model, ids)

    weights = capture(model)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(-3.0)
        model.model.norm.weight = torch.nn.Parameter(torch.zeros_like(model.model.norm.weight))
    path = str(tmp_path / "snap")
    os.makedirs(path)
    write_snapshot(weights, path)

    assert torch.equal(logits(load(path), ids), expected)
    assert not torch.equal(logits(model, ids), expected)


class Aliased(torch.nn.Module):
    """Tensors that share storage in every way a state dict can hold them."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(24, dtype=torch.float32).reshape(4, 6))
        self.register_buffer("transposed", self.weight.detach().t())
        self.register_buffer("row", self.weight.detach()[1])
        self.register_buffer("strided", self.weight.detach()[:, ::2])
        self.linear = torch.nn.Linear(3, 2).half()
        self.alias = self.linear
        self.register_buffer("mask", torch.tensor([True, False, True]))
        self.register_buffer("count", torch.tensor(7, dtype=torch.int64))
        self.register_buffer("empty", torch.zeros(0, 5))
        self.register_buffer("scratch", torch.ones(3), persistent=False)


def test_shared_storage_views_and_strides_are_written_exactly(tmp_path):
    module = Aliased()
    state = module.state_dict()
    with pytest.raises(RuntimeError):
        save_file(dict(state), str(tmp_path / "refused.safetensors"))

    path = snapshot_of(module, str(tmp_path / "snap"))

    written = load_file(os.path.join(path, "model.safetensors"))
    assert set(written) == set(state)
    assert "scratch" not in written
    for name, tensor in state.items():
        assert written[name].dtype == tensor.dtype, name
        assert torch.equal(written[name], tensor), name


def test_state_dict_of_a_wrapped_model_has_no_wrapper_prefix(tmp_path):
    model = tiny_llama()

    for wrapped in (torch.nn.DataParallel(model), torch.compile(model)):
        assert set(plan_state(wrapped).entries) == set(plan_state(model).entries)


def test_state_dict_source_takes_config_tokenizer_and_template_from_base(tmp_path):
    model = tiny_llama(dtype=torch.bfloat16)
    base = make_base_checkpoint(str(tmp_path / "base"), model)
    ids = input_ids()

    path = snapshot_of(model.state_dict(), str(tmp_path / "snap"), base_checkpoint=base)

    assert not os.path.exists(os.path.join(path, "model.safetensors.index.json"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    reference = AutoTokenizer.from_pretrained(base)
    assert tokenizer(LINES[0])["input_ids"] == reference(LINES[0])["input_ids"]
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert GenerationConfig.from_pretrained(path).temperature == 0.6
    assert torch.equal(logits(load(path), ids), logits(model, ids))


def test_model_config_wins_over_base_checkpoint_and_weights_are_never_copied(tmp_path):
    model = tiny_llama()
    base = make_base_checkpoint(str(tmp_path / "base"), tiny_llama(tied=False))

    path = snapshot_of(model, str(tmp_path / "snap"), base_checkpoint=base)

    with open(os.path.join(path, "config.json")) as f:
        assert json.load(f)["tie_word_embeddings"] is True
    written = GenerationConfig.from_pretrained(path)
    assert written.temperature == model.generation_config.temperature != 0.6
    assert os.path.isfile(os.path.join(path, "tokenizer.json"))
    assert torch.equal(logits(load(path), input_ids()), logits(model, input_ids()))


def test_missing_base_checkpoint_names_it(tmp_path):
    weights = capture(tiny_llama())
    with pytest.raises(NotADirectoryError, match="base_checkpoint"):
        write_snapshot(weights, str(tmp_path), base_checkpoint=str(tmp_path / "nowhere"))


def test_safetensors_files_are_byte_identical_to_save_file(tmp_path):
    tensors = {
        f"t{i}": torch.arange(6).reshape(2, 3).to(dtype) for i, dtype in enumerate(DTYPE_NAMES)
    }
    tensors["scalar"] = torch.tensor(1.5)
    tensors["empty"] = torch.zeros(0, 3, dtype=torch.bfloat16)
    tensors["ünïcode"] = torch.ones(2)

    write_file(str(tmp_path / "ours"), tensors, metadata={"format": "pt"}, check=lambda: None)
    save_file(tensors, str(tmp_path / "theirs"), metadata={"format": "pt"})

    assert (tmp_path / "ours").read_bytes() == (tmp_path / "theirs").read_bytes()


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"ok": torch.ones(1), "step": 3}, r"state_dict\['step'\] is a int, not a tensor"),
        ({"w": torch.ones(2, device="meta")}, r"state_dict\['w'\] is on the meta device"),
        ({"z": torch.ones(2, dtype=torch.complex64)}, r"state_dict\['z'\] has dtype"),
    ],
    ids=["not-a-tensor", "meta", "complex"],
)
def test_entries_that_cannot_be_written_are_named(state, message):
    with pytest.raises((TypeError, ValueError), match=message):
        capture(state)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_weights_are_copied_into_pinned_buffers(tmp_path):
    model = tiny_llama(dtype=torch.bfloat16).cuda()
    ids = input_ids().cuda()
    expected = logits(model, ids).cpu()

    weights = capture(model)
    assert all(t.is_pinned() for t in weights.tensors.values())
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    path = str(tmp_path / "snap")
    os.makedirs(path)
    write_snapshot(weights, path)

    assert torch.equal(logits(load(path).cuda(), ids).cpu(), expected)

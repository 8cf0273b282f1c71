"""peft LoRA models exported merged: the checkpoint ``merge_and_unload().save_pretrained()``
writes for a copy of the model, so every engine serves it as a plain model.

The plan maps the peft model's state dict onto the merged model's: ``q_proj.base_layer.weight``
is written as ``q_proj.weight``, merged with the active adapters (``W + scaling * B @ A``,
transposed for ``fan_in_fan_out`` layers and embeddings, with rank and alpha patterns already
folded into each layer's ``scaling``); the adapters themselves (``lora_A``, ``lora_B``) are
not written; a ``modules_to_save`` wrapper is written as its active copy. Keys, dtypes, tied
duplicates and ``_keys_to_ignore_on_save`` follow the base model, whose config (architecture
the base class) goes with the snapshot.

What each point costs the trainer is a copy of what trains: the adapters, and any base tensor
left trainable. The frozen base is copied once into the pool's kept base (``_kept``) and again
only where a frozen tensor changed in place; the merge itself runs in the export thread, into
slots of the point's buffer set, before the write. Layers whose adapters peft has merged into
the base already (``merge_adapter``) changed their base weights through ``.data``, which no
version counter sees: their base weights are copied at every point, and only the adapters not
merged yet are added, as ``merge_and_unload`` does. The plan itself is made once per model
and reused while what it read holds (``_adapter_cache``), so a warm submit costs the copy of
the adapters and a check, not a walk over the state dict and the modules.

Supported: LoRA on ``Linear`` (and transformers' ``Conv1D``, ``fan_in_fan_out``) and
``Embedding`` layers, several active adapters, ``lora_bias``, ``modules_to_save``. Anything
else peft offers (DoRA and other LoRA variants, IA3 and the other tuners, prompt learning,
trainable tokens, LoRA on convolutions, attention or raw parameters, or on a tied weight)
raises :class:`~actorsys.UnsupportedModelError` at submit.

The plan's form and the merge it runs are ``_adapter_merge``'s; what it reads of peft's
layers, ``_peft_layers``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from actorsys.snapshot import _conversions
from actorsys.snapshot._adapters.cache import Fingerprint, PlanCache
from actorsys.snapshot._adapters.merge import AdapterPlan, Merge, Term, slot_nbytes
from actorsys.snapshot._adapters.peft_layers import (
    base_model,
    lora_state,
    output_name,
    owner,
    to_merge,
    unmergeable,
    wrapper_state,
)
from actorsys.snapshot._conversions import Structure
from actorsys.snapshot._forms import check_module, unsupported, walk_modules
from actorsys.snapshot._state_plan import (
    StatePlan,
    _check_entry,
    aligned,
    compiled_key,
    drop_unsaved,
    tensor_nbytes,
)


def plan_adapters(module: torch.nn.Module) -> StatePlan:
    """Plan a snapshot of a peft model (a ``PeftModel``, a tuner such as ``LoraModel``, or a
    model with adapters injected). Cheap: reads no tensor data; the plan of the model's last
    submit is reused while what it read holds (``_adapter_cache``). Raises
    :class:`~actorsys.UnsupportedModelError` for what cannot be merged."""
    model = base_model(module)
    parts = _PLANS.get(model)
    if parts is None:
        parts, fingerprint = _plan(model)
        _PLANS.put(model, parts, fingerprint)
    return parts.plan(model)


@dataclass(frozen=True)
class _Parts:
    """A plan without its model, as kept between submits (holding the model would keep it
    alive)."""

    copies: dict[str, torch.Tensor]
    nbytes: int
    buffer_nbytes: int
    on_cuda: bool
    outputs: dict[str, str | Merge]
    frozen: dict[str, torch.Tensor]
    copied_nbytes: int
    shapes: dict[str, tuple[torch.Size, torch.dtype]]
    num_parameters: int
    structure: Structure | None

    def plan(self, model: torch.nn.Module) -> StatePlan:
        adapters = AdapterPlan(
            model, self.outputs, self.frozen, self.copied_nbytes, self.shapes, self.num_parameters,
            self.structure,
        )
        return StatePlan(
            model, self.copies, self.nbytes, self.buffer_nbytes, self.on_cuda, adapters=adapters
        )


_PLANS: PlanCache[_Parts] = PlanCache()


def _plan(model: torch.nn.Module) -> tuple[_Parts, Fingerprint | None]:
    from peft.tuners.lora import LoraLayer
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper

    walk = list(walk_modules(model))
    layers: dict[str, Any] = {}
    merges: dict[str, list[str]] = {}
    trained: set[str] = set()
    sharded = False
    problem: str | None = None
    for name, submodule in walk:
        # The base's form is checked everywhere first: a quantized base is named as such,
        # even where the adapters over it would not merge either.
        sharded = check_module(name, submodule) or sharded
        for param_name, param in submodule._parameters.items():
            if param is not None and param.requires_grad:
                trained.add(f"{name}.{param_name}" if name else param_name)
        if isinstance(submodule, BaseTunerLayer | AuxiliaryTrainingWrapper):
            problem = problem or unmergeable(name, submodule)
            layers[name] = submodule
            if isinstance(submodule, LoraLayer):
                merges[name] = to_merge(submodule)
    if sharded:
        raise unsupported("adapters-sharded", "peft adapters over sharded (DTensor) parameters")
    if problem is not None:
        raise unsupported("adapters", problem)
    state = model.state_dict()
    for name, value in state.items():
        _check_entry(name, value)
    sources: dict[str, torch.Tensor] = {}
    outputs: dict[str, str | Merge] = {}
    for key, tensor in state.items():
        owner_name = owner(key, layers)
        mapped = key if owner_name is None else output_name(owner_name, layers[owner_name], key)
        if mapped is None:
            continue
        out = compiled_key(mapped)
        sources[key] = tensor
        outputs[out] = key
    by_output = {out: sources[key] for out, key in outputs.items() if isinstance(key, str)}
    drop_unsaved(by_output, model)
    outputs = {out: key for out, key in outputs.items() if out in by_output}
    adapters: dict[str, torch.Tensor] = {}
    storages: dict[int, list[str]] = {}
    for out, tensor in by_output.items():
        storages.setdefault(tensor.untyped_storage().data_ptr(), []).append(out)
    for layer_name, layer in layers.items():
        if layer_name in merges:
            _plan_merge(layer_name, layer, merges[layer_name], state, outputs, adapters, trained, storages)
    copies: dict[str, torch.Tensor] = {}
    frozen: dict[str, torch.Tensor] = {}
    shapes: dict[str, tuple[torch.Size, torch.dtype]] = {}
    nbytes = num_parameters = 0
    for out, spec in outputs.items():
        source_key = spec.source if isinstance(spec, Merge) else spec
        source = sources[source_key]
        (copies if source_key in trained else frozen)[source_key] = source
        if isinstance(spec, Merge):
            shapes[out] = (source.shape, source.dtype)
        nbytes += tensor_nbytes(source)
        num_parameters += source.numel()
    copies.update(adapters)
    copied_nbytes = sum(aligned(tensor_nbytes(t)) for t in copies.values())
    slots_nbytes = sum(aligned(slot_nbytes(*shape)) for shape in shapes.values())
    on_cuda = any(t.device.type == "cuda" for t in (*copies.values(), *frozen.values()))
    parts = _Parts(
        copies, nbytes, copied_nbytes + slots_nbytes, on_cuda, outputs, frozen, copied_nbytes,
        shapes, num_parameters, _conversions.structure(model),
    )
    planned = {*copies, *frozen}
    checked = [
        (layer, lora_state if name in merges else wrapper_state) for name, layer in layers.items()
    ]
    return parts, Fingerprint.of(walk, state, planned, checked, _model_state)


def _model_state(model: torch.nn.Module) -> object:
    return tuple(getattr(model, "_keys_to_ignore_on_save", None) or ())


def _plan_merge(
    name: str,
    layer: Any,
    names: list[str],
    state: Mapping[str, torch.Tensor],
    outputs: dict[str, str | Merge],
    adapters: dict[str, torch.Tensor],
    trained: set[str],
    storages: Mapping[int, list[str]],
) -> None:
    """Turn the layer's outputs into merges with its active adapters not merged yet."""
    from peft.tuners.lora import Embedding

    embedding = isinstance(layer, Embedding)
    weight_key, bias_key = f"{name}.base_layer.weight", f"{name}.base_layer.bias"
    weight_out, bias_out = compiled_key(f"{name}.weight"), compiled_key(f"{name}.bias")
    if layer.merged:
        trained.update(k for k in (weight_key, bias_key) if k in state)
    if not names or weight_out not in outputs:
        return
    sharing = [o for o in storages.get(state[weight_key].untyped_storage().data_ptr(), ()) if o != weight_out]
    if sharing:
        raise unsupported("adapters", f"LoRA on a tied weight ({name}, tied to {sharing[0]})")
    terms: list[Term] = []
    bias_terms: list[tuple[str, float]] = []
    for adapter in names:
        scaling = float(layer.scaling[adapter])
        if embedding:
            a, b = f"{name}.lora_embedding_A.{adapter}", f"{name}.lora_embedding_B.{adapter}"
            terms.append(Term(a, b, scaling, transposed=True, dtype_of=a, to_base=True))
        else:
            a, b = f"{name}.lora_A.{adapter}.weight", f"{name}.lora_B.{adapter}.weight"
            terms.append(Term(a, b, scaling, layer.fan_in_fan_out, dtype_of=b, to_base=False))
            if layer.lora_bias.get(adapter):
                bias_terms.append((f"{name}.lora_B.{adapter}.bias", scaling))
        for key in (a, b):
            adapters[key] = state[key]
    outputs[weight_out] = Merge(weight_key, tuple(terms))
    if bias_terms:
        if bias_out not in outputs:
            raise unsupported("adapters", f"lora_bias on a layer without a bias ({name})")
        outputs[bias_out] = Merge(bias_key, bias=tuple(bias_terms))
        for key, _ in bias_terms:
            adapters[key] = state[key]


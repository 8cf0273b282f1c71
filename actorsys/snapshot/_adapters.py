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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from actorsys.snapshot import _conversions
from actorsys.snapshot._adapter_cache import Fingerprint, PlanCache
from actorsys.snapshot._conversions import Structure
from actorsys.snapshot._forms import check_module, unsupported, walk_modules
from actorsys.snapshot._kept import KeptBase
from actorsys.snapshot._tensors import (
    StatePlan,
    _check_entry,
    _drop_tied_duplicates,
    _tied_patterns,
    aligned,
    compiled_key,
    tensor_nbytes,
)

HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Term:
    """One adapter's delta, ``scaling * B @ A`` (transposed when ``transposed``), as peft's
    ``get_delta_weight`` computes it: in float32 when ``dtype_of`` (the adapter tensor peft
    takes the dtype from) is half, cast back to it; ``to_base`` casts it to the base's dtype
    before the addition (peft's embeddings do)."""

    a: str
    b: str
    scaling: float
    transposed: bool
    dtype_of: str
    to_base: bool


@dataclass(frozen=True)
class Merge:
    """An output tensor computed in the export thread: ``source`` plus each term, in order;
    ``bias`` terms add ``scaling * B.bias``."""

    source: str
    terms: tuple[Term, ...] = ()
    bias: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class AdapterPlan:
    """``outputs``: checkpoint name -> source key (a copied or kept tensor) or a Merge;
    ``frozen``: the tensors kept across points; ``owner``: the base model they belong to."""

    owner: torch.nn.Module
    outputs: dict[str, str | Merge]
    frozen: dict[str, torch.Tensor]
    copied_nbytes: int
    """Bytes of the copied tensors in a buffer set (aligned); merge slots follow them."""
    shapes: dict[str, tuple[torch.Size, torch.dtype]]
    """Shape and dtype of every output that is merged."""
    num_parameters: int
    """Elements of the checkpoint's tensors (the merged model's parameter count)."""
    structure: Structure | None = None
    """What transformers' weight conversions depend on (``_conversions.structure``)."""


def plan_adapters(module: torch.nn.Module) -> StatePlan:
    """Plan a snapshot of a peft model (a ``PeftModel``, a tuner such as ``LoraModel``, or a
    model with adapters injected). Cheap: reads no tensor data; the plan of the model's last
    submit is reused while what it read holds (``_adapter_cache``). Raises
    :class:`~actorsys.UnsupportedModelError` for what cannot be merged."""
    model = _base_model(module)
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
    to_merge: dict[str, list[str]] = {}
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
            problem = problem or _unmergeable(name, submodule)
            layers[name] = submodule
            if isinstance(submodule, LoraLayer):
                to_merge[name] = _to_merge(submodule)
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
        owner_name = _owner(key, layers)
        mapped = key if owner_name is None else _output_name(owner_name, layers[owner_name], key)
        if mapped is None:
            continue
        out = compiled_key(mapped)
        sources[key] = tensor
        outputs[out] = key
    for name in getattr(model, "_keys_to_ignore_on_save", None) or ():
        outputs.pop(name, None)
    by_output = {out: sources[key] for out, key in outputs.items() if isinstance(key, str)}
    _drop_tied_duplicates(by_output, lambda: _tied_patterns(model))
    outputs = {out: key for out, key in outputs.items() if out in by_output}
    adapters: dict[str, torch.Tensor] = {}
    storages: dict[int, list[str]] = {}
    for out, tensor in by_output.items():
        storages.setdefault(tensor.untyped_storage().data_ptr(), []).append(out)
    for layer_name, layer in layers.items():
        if layer_name in to_merge:
            _plan_merge(layer_name, layer, to_merge[layer_name], state, outputs, adapters, trained, storages)
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
    slots_nbytes = sum(aligned(_nbytes(*shape)) for shape in shapes.values())
    on_cuda = any(t.device.type == "cuda" for t in (*copies.values(), *frozen.values()))
    parts = _Parts(
        copies, nbytes, copied_nbytes + slots_nbytes, on_cuda, outputs, frozen, copied_nbytes,
        shapes, num_parameters, _conversions.structure(model),
    )
    planned = {*copies, *frozen}
    checked = [
        (layer, _lora_state if name in to_merge else _wrapper_state) for name, layer in layers.items()
    ]
    return parts, Fingerprint.of(walk, state, planned, checked, _model_state)


def _lora_state(layer: Any) -> object:
    """What a plan reads of a LoRA layer besides its tensors and modules."""
    return (
        tuple(layer.active_adapters),
        tuple(layer.merged_adapters),
        tuple(layer.scaling.items()),
        tuple(layer.lora_bias.items()),
        tuple(layer.lora_variant),
        tuple(layer.use_dora.items()),
        getattr(layer, "fan_in_fan_out", None),
    )


def _wrapper_state(layer: Any) -> object:
    """What a plan reads of a ``modules_to_save`` wrapper besides its modules."""
    return tuple(layer.active_adapters)


def _model_state(model: torch.nn.Module) -> object:
    return tuple(getattr(model, "_keys_to_ignore_on_save", None) or ())


def assemble(
    plan: AdapterPlan,
    copies: dict[str, torch.Tensor],
    buffer: torch.Tensor,
    kept: KeptBase,
) -> tuple[dict[str, torch.Tensor], Callable[[Callable[[], None]], None], Callable[[], None]]:
    """The output tensors of a point whose trained tensors were copied into ``copies`` (at
    the start of ``buffer``): the kept base refreshed (blocking, in the caller's thread, for
    what changed), merge slots laid out after the copies. Returns the outputs, the merge to
    run in the export thread (it takes the write's liveness check) and the release of the
    kept base."""
    base, release = kept.refresh(plan.owner, plan.frozen, hold=True)
    tensors: dict[str, torch.Tensor] = {}
    offset = plan.copied_nbytes
    merges: list[tuple[torch.Tensor, Merge]] = []
    for out, key in plan.outputs.items():
        if isinstance(key, Merge):
            shape, dtype = plan.shapes[out]
            nbytes = _nbytes(shape, dtype)
            slot = buffer[offset : offset + nbytes].view(dtype).view(shape)
            offset += aligned(nbytes)
            tensors[out] = slot
            merges.append((slot, key))
        else:
            tensors[out] = copies[key] if key in copies else base[key]

    def merge(check: Callable[[], None]) -> None:
        with torch.no_grad():
            for slot, spec in merges:
                check()
                _merge_into(slot, spec, copies, base)

    return tensors, merge, release


def _merge_into(
    slot: torch.Tensor, spec: Merge, copies: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor]
) -> None:
    def get(key: str) -> torch.Tensor:
        return copies[key] if key in copies else base[key]

    slot.copy_(get(spec.source))
    for term in spec.terms:
        a, b = get(term.a), get(term.b)
        dtype = get(term.dtype_of).dtype
        cast = dtype in HALF
        if cast:
            a, b = a.float(), b.float()
        delta = b @ a
        if term.transposed:
            delta = delta.T
        delta = delta * term.scaling
        if cast:
            delta = delta.to(dtype)
        if term.to_base:
            delta = delta.to(slot.dtype)
        slot += delta
    for key, scaling in spec.bias:
        slot += get(key) * scaling


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


def _unmergeable(name: str, layer: Any) -> str | None:
    """What keeps the peft ``layer`` at ``name`` from merging as plain LoRA, if anything."""
    from peft.tuners.lora import Embedding, Linear, LoraLayer
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import ModulesToSaveWrapper

    cls = type(layer)
    if isinstance(layer, ModulesToSaveWrapper):
        active = layer.active_adapters
        inner = (m for a in active for m in layer.modules_to_save[a].modules())
        if len(active) > 1 or any(isinstance(m, BaseTunerLayer) for m in inner):
            return f"modules_to_save with adapters inside ({name})"
        return None
    if not isinstance(layer, BaseTunerLayer):
        return f"peft {cls.__name__} ({name})"
    if not isinstance(layer, LoraLayer):
        tuner = cls.__module__.removeprefix("peft.tuners.").split(".")[0]
        return f"peft {tuner.upper()} adapters ({cls.__name__} at {name})"
    if cls not in (Linear, Embedding):
        return f"LoRA on {cls.__name__} layers ({name})"
    if any(a in layer.lora_variant for a in _to_merge(layer)):
        variant = "DoRA" if any(layer.use_dora.values()) else "a LoRA variant"
        return f"{variant} (at {name}), which is not merged as plain LoRA"
    return None


def _to_merge(layer: Any) -> list[str]:
    """The adapters ``merge_and_unload`` merges into ``layer``: the active ones it holds that
    are not merged already."""
    held = set(layer.lora_A) | set(layer.lora_embedding_A)
    return [a for a in layer.active_adapters if a in held and a not in layer.merged_adapters]


def _base_model(module: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a ``PeftModel`` / tuner, where the adapters live."""
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTuner

    if isinstance(module, PeftModel):
        for adapter in module.active_adapters:
            config = module.peft_config.get(adapter)
            if config is not None and getattr(config, "is_prompt_learning", False):
                raise unsupported("adapters", f"peft prompt learning ({config.peft_type})")
        module = module.base_model
    if isinstance(module, BaseTuner):
        module = module.model
    return module


WRAPPED = (".base_layer.", ".lora_", ".modules_to_save.", ".original_module.")
"""What the keys of a peft layer's own tensors hold (a cheap test before the prefix search)."""


def _owner(key: str, layers: Mapping[str, Any]) -> str | None:
    if not any(part in key for part in WRAPPED):
        return None
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in layers:
            return prefix
    return None


def _output_name(prefix: str, layer: Any, key: str) -> str | None:
    """Where ``key`` of the wrapping ``layer`` at ``prefix`` lands in the merged model."""
    rest = key[len(prefix) + 1 :]
    if hasattr(layer, "modules_to_save"):
        active = layer.active_adapters
        inner = f"modules_to_save.{active[0]}." if active else "original_module."
        return f"{prefix}.{rest.removeprefix(inner)}" if rest.startswith(inner) else None
    if rest.startswith("base_layer."):
        return f"{prefix}.{rest.removeprefix('base_layer.')}"
    return None


def _nbytes(shape: torch.Size, dtype: torch.dtype) -> int:
    return shape.numel() * dtype.itemsize

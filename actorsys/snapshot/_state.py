"""Which tensors of a model or state dict a checkpoint holds, by transformers' rules.

``module.state_dict()`` semantics: parameters and persistent buffers, never non-persistent ones.
Keys a transformers model lists in ``_keys_to_ignore_on_save`` are left out, and so are the tied
duplicates it re-ties when loading (``lm_head.weight`` sharing the embeddings' storage): the
same names ``save_pretrained`` drops, since safetensors cannot hold two names for one storage.
Every other tensor is copied on its own, whatever storage it shares and however it is strided,
so views, slices and transposes round-trip exactly.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from actorsys.snapshot._forms import ModelForm, model_form
from actorsys.snapshot._safetensors import DTYPE_NAMES

if TYPE_CHECKING:
    from actorsys.snapshot._adapters import AdapterPlan

ALIGNMENT = 64
"""Byte alignment of every tensor inside a buffer set (any dtype can be viewed there)."""

Source = torch.nn.Module | Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class StatePlan:
    """What a capture copies: ``entries`` (name -> source tensor, in state-dict order)."""

    model: torch.nn.Module | None
    entries: dict[str, torch.Tensor]
    nbytes: int
    """Bytes of tensor data, as written to disk."""
    buffer_nbytes: int
    """Bytes of buffer the copy needs (``nbytes`` plus alignment)."""
    on_cuda: bool
    adapters: AdapterPlan | None = None
    """For a peft model: how the checkpoint's tensors are assembled from ``entries`` (what
    trains), the kept frozen base and merges run in the export thread (see ``_adapters``)."""
    sharding: Any = None
    """A sharded model's layout (``_sharded.Sharding``): ``entries`` are then this rank's
    local shards, ``nbytes`` the bytes of the whole snapshot."""


def plan_state(source: Source) -> StatePlan:
    """Read ``source``'s state dict and decide what a checkpoint of it holds.

    Cheap (no tensor data is touched). Raises ``TypeError`` / ``ValueError`` naming the entry
    that cannot be written: a value that is not a tensor, a tensor on the meta device, a dtype
    safetensors cannot hold; :class:`~actorsys.UnsupportedModelError` for a model in a form
    that cannot be copied (see ``_forms``).
    """
    from actorsys.snapshot import _sharded

    if isinstance(source, torch.nn.Module):
        module = unwrap(source)
        form = model_form(module)
        if form is ModelForm.ADAPTERS:
            from actorsys.snapshot._adapters import plan_adapters  # it builds on this module

            return plan_adapters(module)
        if form is ModelForm.SHARDED:
            return _sharded.plan_sharded(module, {})
        model: torch.nn.Module | None = module
        state = {compiled_key(name): t for name, t in module.state_dict().items()}
    else:
        model, state = None, dict(source)
        if any(isinstance(t, _sharded.DTensor) for t in state.values()):
            return _sharded.plan_sharded(None, state)
    for name, value in state.items():
        _check_entry(name, value)
    if model is not None:
        for name in getattr(model, "_keys_to_ignore_on_save", None) or ():
            state.pop(name, None)
        _drop_tied_duplicates(state, lambda: _tied_patterns(model))
    nbytes = sum(tensor_nbytes(t) for t in state.values())
    buffer_nbytes = sum(aligned(tensor_nbytes(t)) for t in state.values())
    on_cuda = any(t.device.type == "cuda" for t in state.values())
    return StatePlan(model, state, nbytes, buffer_nbytes, on_cuda)


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The model inside data-parallel, ``torch.compile`` and accelerate's wrappers (their
    state-dict keys carry ``module.`` / ``_orig_mod.`` prefixes a checkpoint must not have):
    DDP, DataParallel, DeepSpeed's engine (which accelerate wraps ZeRO-1/2 models in), and
    ``torch.compile`` of the model (a peft model included)."""
    while True:
        inner: object
        if isinstance(
            module, torch.nn.DataParallel | torch.nn.parallel.DistributedDataParallel
        ) or _is_deepspeed_engine(module):
            inner = module.module
        else:
            inner = getattr(module, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return module
        module = inner


def compiled_key(name: str) -> str:
    """``name`` without the ``_orig_mod.`` segments of submodules compiled on their own
    (``torch.compile`` of a block, accelerate's regional compilation)."""
    if "_orig_mod." not in name:
        return name
    return ".".join(part for part in name.split(".") if part != "_orig_mod")


def _is_deepspeed_engine(module: torch.nn.Module) -> bool:
    cls = type(module)
    return cls.__name__ == "DeepSpeedEngine" and cls.__module__.startswith("deepspeed")


def tensor_nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def _check_entry(name: str, value: object) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"state_dict[{name!r}] is a {type(value).__name__}, not a tensor; pass only tensors "
            "(or write the checkpoint yourself with export=)"
        )
    if value.device.type == "meta":
        raise ValueError(
            f"state_dict[{name!r}] is on the meta device (offloaded or not initialised); "
            "materialise it first, or write the checkpoint yourself with export="
        )
    if value.layout is not torch.strided:
        raise ValueError(f"state_dict[{name!r}] is a {value.layout} tensor; pass dense tensors")
    if value.dtype not in DTYPE_NAMES:
        supported = ", ".join(str(d).removeprefix("torch.") for d in DTYPE_NAMES)
        raise ValueError(
            f"state_dict[{name!r}] has dtype {value.dtype}, which safetensors cannot hold; "
            f"convert it to one of {supported}"
        )


def _tied_patterns(model: torch.nn.Module) -> list[str]:
    """The keys a transformers model re-ties on load, prefixed by submodule (as transformers'
    ``_get_tied_weight_keys`` does). ``_tied_weights_keys`` is a dict in transformers 5, a
    list before."""
    patterns: list[str] = []
    for prefix, submodule in model.named_modules():
        tied = getattr(submodule, "_tied_weights_keys", None) or ()
        patterns.extend(f"{prefix}.{key}" if prefix else key for key in tied)
    return patterns


def _drop_tied_duplicates(
    state: dict[str, torch.Tensor], tied_patterns: Callable[[], list[str]]
) -> None:
    """Drop the declared tied names of tensors that are the very same view of one storage.

    Follows transformers' ``remove_tied_weights_from_state_dict``: within a group sharing a
    storage, sorted names matching a tied pattern are dropped, always keeping one name. Unlike
    it, a name is dropped only when another kept name is the identical view (same offset,
    dtype, shape and stride): anything else is copied separately and so written exactly.
    The patterns are read (a walk over every module) only if some storage is shared.
    """
    by_storage: dict[tuple[torch.device, int], list[str]] = defaultdict(list)
    for name, tensor in state.items():
        storage = tensor.untyped_storage()
        if storage.nbytes() > 0:
            by_storage[(tensor.device, storage.data_ptr())].append(name)
    patterns: list[str] | None = None
    for names in by_storage.values():
        if len(names) < 2:
            continue
        if patterns is None:
            patterns = tied_patterns()
        to_drop: set[str] = set()
        found = 0
        for name in sorted(names):
            if any(re.search(pattern, name) for pattern in patterns):
                found += 1
                if found < len(names):
                    to_drop.add(name)
        by_view: dict[tuple[object, ...], list[str]] = defaultdict(list)
        for name in names:
            t = state[name]
            by_view[(t.data_ptr(), t.dtype, tuple(t.shape), t.stride())].append(name)
        for same in by_view.values():
            droppable = [name for name in sorted(same) if name in to_drop]
            if len(droppable) == len(same):
                droppable = droppable[:-1]
            for name in droppable:
                del state[name]

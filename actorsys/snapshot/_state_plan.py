"""The facts about a model's tensors that the planners share (``_state`` for a plain model,
``_adapters`` for a peft one, ``_sharded`` for DTensors): what a capture copies (``StatePlan``),
the bytes a tensor takes and its aligned place in a buffer set, which entries a checkpoint can
hold, and which names a transformers model re-ties on load.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from actorsys.snapshot._pool.memory import ALIGNMENT, aligned  # noqa: F401 (their home before)
from actorsys.snapshot._write.safetensors import DTYPE_NAMES

if TYPE_CHECKING:
    from actorsys.snapshot._adapters.merge import AdapterPlan

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
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """Facts of the model that hold as long as this plan does (its parameter count, whether
    transformers reverts weight conversions for it), looked up at the first capture only: a
    reused plan (see ``_plans``) shares them."""


def compiled_key(name: str) -> str:
    """``name`` without the ``_orig_mod.`` segments of submodules compiled on their own
    (``torch.compile`` of a block, accelerate's regional compilation)."""
    if "_orig_mod." not in name:
        return name
    return ".".join(part for part in name.split(".") if part != "_orig_mod")


def tensor_nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


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


def drop_unsaved(entries: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    """Remove from ``entries`` (checkpoint name -> tensor) what ``save_pretrained`` leaves out
    of ``model``'s checkpoint: the keys it lists in ``_keys_to_ignore_on_save``, and its tied
    duplicates (see :func:`_drop_tied_duplicates`)."""
    for name in getattr(model, "_keys_to_ignore_on_save", None) or ():
        entries.pop(name, None)
    _drop_tied_duplicates(entries, lambda: _tied_patterns(model))


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

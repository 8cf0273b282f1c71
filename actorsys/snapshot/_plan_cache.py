"""Plans reused per model: planning a model planned before, and unchanged since, is one check.

A plan (``StatePlan``) follows from the model's structure alone: which module holds which
parameters and buffers under which names, and each tensor's class, address, dtype, shape,
strides and device (a sharded one's placements and mesh too). :func:`remember` records that
layout beside the plan; :func:`recall` gives the plan back, its entries read afresh from the
very tensors, while one flat pass over the recorded layout finds every module, parameter and
buffer the same object as before with the same facts. A parameter replaced or resized, a
module or buffer added or removed, a tensor moved or cast, a state-dict hook registered: a
new plan.

The cache holds models, modules and tensors weakly, so it never keeps a model or a replaced
tensor alive. A model whose state dict is not its parameters and buffers as they stand (a class
overriding ``state_dict`` or ``_save_to_state_dict``, a state-dict post-hook) is planned afresh
each time. State-dict pre-hooks (FSDP2 registers one that puts the sharded parameters back in
place) run before the check, as ``state_dict`` runs them.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from actorsys.snapshot._forms import walk_modules
from actorsys.snapshot._state_plan import StatePlan, compiled_key

_lock = threading.Lock()
_plans: weakref.WeakKeyDictionary[torch.nn.Module, _Remembered] = weakref.WeakKeyDictionary()

Ref = Callable[[], Any]


class _Module(NamedTuple):
    ref: Ref
    prefix: str
    ids: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    """The ids of its children, parameters and buffers (each of them alive while it is
    checked: children are checked through their own weak references, tensors through
    ``_Remembered.facts``, so an equal id is the same object)."""
    non_persistent: frozenset[str]
    pre_hooks: int


@dataclass(frozen=True)
class _Remembered:
    modules: tuple[_Module, ...]
    facts: tuple[tuple[Ref, tuple[object, ...]], ...]
    entries: tuple[tuple[str, Ref], ...]
    plan: StatePlan
    """The plan without its model and entries (the cache holds neither)."""
    keep_vars: bool


def recall(module: torch.nn.Module) -> StatePlan | None:
    """The plan :func:`remember` recorded for ``module`` if it still holds, else None."""
    with _lock:
        remembered = _plans.get(module)
    if remembered is None:
        return None
    keep_vars = remembered.keep_vars
    for ref, prefix, ids, non_persistent, pre_hooks in remembered.modules:
        submodule = ref()
        if submodule is None:
            return None
        hooks = submodule._state_dict_pre_hooks
        if len(hooks) != pre_hooks:
            return None
        for hook in list(hooks.values()):
            hook(submodule, prefix, keep_vars)
        if _ids(submodule) != ids or submodule._non_persistent_buffers_set != non_persistent:
            return None
    for tensor_ref, facts in remembered.facts:
        tensor = tensor_ref()
        if tensor is None or _facts(tensor) != facts:
            return None
    entries: dict[str, torch.Tensor] = {}
    for name, ref in remembered.entries:
        entries[name] = _entry(ref())
    return dataclasses.replace(remembered.plan, model=module, entries=entries)


def remember(module: torch.nn.Module, plan: StatePlan, *, keep_vars: bool, compiled: bool) -> None:
    """Record ``plan`` (just made from ``module``'s state dict, with ``keep_vars`` as given,
    its keys passed through ``compiled_key`` if ``compiled``) for :func:`recall`. Records
    nothing for a model it cannot vouch for: a class with its own ``state_dict`` or
    ``_save_to_state_dict``, a state-dict post-hook, or entries that are not exactly the
    parameters and buffers the walk finds."""
    if type(module).state_dict is not torch.nn.Module.state_dict:
        return
    modules: list[_Module] = []
    facts: dict[int, tuple[Ref, tuple[object, ...]]] = {}
    sources: dict[str, torch.Tensor] = {}
    for name, submodule in walk_modules(module):
        cls = type(submodule)
        if cls._save_to_state_dict is not torch.nn.Module._save_to_state_dict:
            return
        if submodule._state_dict_hooks:
            return
        prefix = f"{name}." if name else ""
        modules.append(_Module(
            weakref.ref(submodule), prefix, _ids(submodule),
            frozenset(submodule._non_persistent_buffers_set), len(submodule._state_dict_pre_hooks),
        ))
        for key, tensor in submodule._parameters.items():
            if tensor is not None:
                sources[prefix + key] = tensor
                facts.setdefault(id(tensor), (weakref.ref(tensor), _facts(tensor)))
        for key, buffer in submodule._buffers.items():
            if buffer is not None:
                facts.setdefault(id(buffer), (weakref.ref(buffer), _facts(buffer)))
                if key not in submodule._non_persistent_buffers_set:
                    sources[prefix + key] = buffer
    if compiled:
        sources = {compiled_key(name): tensor for name, tensor in sources.items()}
    entries: list[tuple[str, Ref]] = []
    for name, planned in plan.entries.items():
        source = sources.get(name)
        if source is None or not _same_view(_entry(source), planned):
            return
        entries.append((name, weakref.ref(source)))
    remembered = _Remembered(
        tuple(modules), tuple(facts.values()), tuple(entries),
        dataclasses.replace(plan, model=None, entries={}), keep_vars,
    )
    with _lock:
        _plans[module] = remembered


def forget(module: torch.nn.Module | None = None) -> None:
    """Drop the plan remembered for ``module`` (every plan, with None)."""
    with _lock:
        if module is None:
            _plans.clear()
        else:
            _plans.pop(module, None)


def _ids(module: torch.nn.Module) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    return (
        tuple(map(id, module._modules.values())),
        tuple(map(id, module._parameters.values())),
        tuple(map(id, module._buffers.values())),
    )


def _facts(tensor: torch.Tensor) -> tuple[object, ...]:
    cls = type(tensor)
    if cls is torch.nn.Parameter or cls is torch.Tensor:
        return (cls, tensor.data_ptr(), tensor.dtype, tensor.shape, tensor.stride(), tensor.device)
    local = getattr(tensor, "_local_tensor", None)
    if not isinstance(local, torch.Tensor):
        local = tensor
    return (
        cls, local.data_ptr(), local.dtype, local.shape, local.stride(), local.device,
        tensor.shape, tuple(getattr(tensor, "placements", ())),
        id(getattr(tensor, "device_mesh", None)),
    )


def _entry(tensor: torch.Tensor) -> torch.Tensor:
    """What a plan copies of ``tensor``: its data, detached (a DTensor's local shard).

    A DTensor's shard is read from ``_local_tensor`` and detached there: the same view
    ``detach().to_local()`` gives (``remember`` checks so), without two dispatches through
    DTensor's Python layer, which cost ~15 us an entry, on every submit's stall."""
    cls = type(tensor)
    if cls is torch.nn.Parameter or cls is torch.Tensor:
        return tensor.detach()
    local = getattr(tensor, "_local_tensor", None)
    if isinstance(local, torch.Tensor):
        return local.detach()
    detached = tensor.detach()
    to_local = getattr(detached, "to_local", None)
    return to_local() if callable(to_local) else detached


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape == b.shape
        and a.stride() == b.stride() and a.device == b.device
    )

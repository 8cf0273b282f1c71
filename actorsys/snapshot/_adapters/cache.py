"""An adapter plan reused from one point to the next while the model keeps its form.

Planning a peft model reads every module and state-dict entry (a few milliseconds in Python
for a small Llama, on the trainer's thread at every submit), yet between two points of a
training run nothing it reads changes: an optimizer step changes tensor data in place, which a
plan never reads. So a plan is kept per model, beside a :class:`Fingerprint` of what it read,
and reused while the fingerprint holds. The check costs a fraction of a plan: the number of
entries in every module's parameter, buffer, submodule and state-dict hook containers; the
identity of every submodule; for each planned tensor, that it is still the very object its
module holds, with the same address, shape, strides, dtype, device and ``requires_grad``; and
each adapter layer's own state (the active and merged adapters, the scalings, what
``_adapters`` reads of it). Adapters added, removed, resized or switched, a merge, a module or
parameter replaced, ``.data`` pointed elsewhere, a tensor moved or cast, a weight frozen or
unfrozen: each fails the check and the next submit plans afresh.

A model is reused only when its state dict is ``torch.nn.Module``'s own (no state-dict hooks,
no class overriding ``state_dict``, ``_save_to_state_dict`` or ``get_extra_state``) and every
entry is a parameter or persistent buffer of the module named by its key, so that what the
check reads is all the state dict could show. Otherwise it is planned at every submit, as
before.

Kept without keeping the model alive: entries are weakly keyed by the model, and the
fingerprint holds its containers and submodules, never the model itself. Thread-safe.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import torch

Module = torch.nn.Module
Signature = tuple[int, torch.Size, tuple[int, ...], torch.dtype, torch.device, bool]
T = TypeVar("T")


class Fingerprint:
    """What a plan of ``model`` read, checked by :meth:`holds` at the next submit."""

    def __init__(
        self,
        modules: list[Module],
        slots: list[tuple[dict[str, Any], str, torch.Tensor]],
        layers: Sequence[tuple[Module, Callable[[Any], object]]],
        root: Module,
        extra: Callable[[Module], object],
    ) -> None:
        self._containers = [c for m in modules for c in _containers(m)]
        self._counts = [len(c) for c in self._containers]
        self._children_dicts = [m._modules for m in modules]
        self._children = [c for d in self._children_dicts for c in d.values()]
        self._child_ids = [id(c) for c in self._children]
        self._slots = [(d, name, t, _signature(t)) for d, name, t in slots]
        self._layers = [(layer, state, state(layer)) for layer, state in layers]
        self._extra = extra
        self._extra_value = extra(root)

    @classmethod
    def of(
        cls,
        walk: list[tuple[str, Module]],
        state: Mapping[str, torch.Tensor],
        planned: Iterable[str],
        layers: Sequence[tuple[Module, Callable[[Any], object]]],
        extra: Callable[[Module], object],
    ) -> Fingerprint | None:
        """The fingerprint of a plan that read ``state`` (the state dict of ``walk``'s root),
        the adapter ``layers`` (each with the function that reads its state) and
        ``extra(root)``, and copies or keeps the entries ``planned``; None if the model's
        state dict is not ``Module``'s own (then the model is planned at every submit).
        ``extra`` and the layers' functions must not hold the root: the fingerprint is kept
        without keeping the model alive."""
        live: dict[str, tuple[dict[str, Any], str]] = {}
        for prefix, module in walk:
            cls_ = type(module)
            if (
                cls_.state_dict is not Module.state_dict
                or cls_._save_to_state_dict is not Module._save_to_state_dict
                or cls_.get_extra_state is not Module.get_extra_state
                or module._state_dict_hooks
                or module._state_dict_pre_hooks
            ):
                return None
            at = f"{prefix}." if prefix else ""
            for name, param in module._parameters.items():
                if param is not None:
                    live[at + name] = (module._parameters, name)
            for name, buffer in module._buffers.items():
                if buffer is not None and name not in module._non_persistent_buffers_set:
                    live[at + name] = (module._buffers, name)
        if live.keys() != state.keys():
            return None
        slots: list[tuple[dict[str, Any], str, torch.Tensor]] = []
        for key in planned:
            container, name = live[key]
            tensor = container[name]
            if _view(tensor) != _view(state[key]):
                return None
            slots.append((container, name, tensor))
        root = walk[0][1]
        return cls([m for _, m in walk], slots, layers, root, extra)

    def holds(self, root: Module) -> bool:
        """Whether everything the plan of ``root`` read is as it was. Cheap: no tensor data
        is read."""
        if [len(c) for c in self._containers] != self._counts:
            return False
        if [id(c) for d in self._children_dicts for c in d.values()] != self._child_ids:
            return False
        for container, name, tensor, signature in self._slots:
            if container.get(name) is not tensor or _signature(tensor) != signature:
                return False
        for layer, state, value in self._layers:
            if state(layer) != value:
                return False
        return self._extra(root) == self._extra_value


class PlanCache(Generic[T]):
    """One reusable plan per model, with the fingerprint it holds while."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: weakref.WeakKeyDictionary[Module, tuple[T, Fingerprint]] = (
            weakref.WeakKeyDictionary()
        )

    def get(self, model: Module) -> T | None:
        """``model``'s plan if its fingerprint still holds (else it is forgotten)."""
        with self._lock:
            entry = self._entries.get(model)
        if entry is None:
            return None
        plan, fingerprint = entry
        if fingerprint.holds(model):
            return plan
        self.forget(model)
        return None

    def put(self, model: Module, plan: T, fingerprint: Fingerprint | None) -> None:
        if fingerprint is None:
            self.forget(model)
            return
        with self._lock:
            self._entries[model] = (plan, fingerprint)

    def forget(self, model: Module) -> None:
        with self._lock:
            self._entries.pop(model, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def _containers(module: Module) -> tuple[Any, ...]:
    return (
        module._modules,
        module._parameters,
        module._buffers,
        module._non_persistent_buffers_set,
        module._state_dict_hooks,
        module._state_dict_pre_hooks,
    )


def _signature(tensor: torch.Tensor) -> Signature:
    return (
        tensor.data_ptr(),
        tensor.shape,
        tensor.stride(),
        tensor.dtype,
        tensor.device,
        tensor.requires_grad,
    )


def _view(tensor: torch.Tensor) -> tuple[int, torch.Size, tuple[int, ...], torch.dtype]:
    return tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype

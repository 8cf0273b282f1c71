"""Which tensors of a model or state dict a checkpoint holds, by transformers' rules.

``module.state_dict()`` semantics: parameters and persistent buffers, never non-persistent ones.
Keys a transformers model lists in ``_keys_to_ignore_on_save`` are left out, and so are the tied
duplicates it re-ties when loading (``lm_head.weight`` sharing the embeddings' storage): the
same names ``save_pretrained`` drops, since safetensors cannot hold two names for one storage.
Every other tensor is copied on its own, whatever storage it shares and however it is strided,
so views, slices and transposes round-trip exactly.
"""

from __future__ import annotations

import torch

from actorsys.snapshot import _plan_cache as _plans
from actorsys.snapshot._adapters.plan import plan_adapters
from actorsys.snapshot._forms import ModelForm, model_form
from actorsys.snapshot._sharded import plan as _sharded_plan
from actorsys.snapshot._state_plan import (
    Source,
    StatePlan,
    _check_entry,
    aligned,
    compiled_key,
    drop_unsaved,
    tensor_nbytes,
)


def plan_state(source: Source) -> StatePlan:
    """Read ``source``'s state dict and decide what a checkpoint of it holds.

    Cheap (no tensor data is touched), and cheaper again for a model planned before and
    unchanged since: its plan is reused (see ``_plans``). Raises ``TypeError`` /
    ``ValueError`` naming the entry that cannot be written: a value that is not a tensor, a
    tensor on the meta device, a dtype safetensors cannot hold;
    :class:`~actorsys.UnsupportedModelError` for a model in a form that cannot be copied
    (see ``_forms``).
    """
    if isinstance(source, torch.nn.Module):
        module = unwrap(source)
        known = _plans.recall(module)
        if known is not None:
            return known
        form = model_form(module)
        if form is ModelForm.ADAPTERS:
            return plan_adapters(module)
        if form is ModelForm.SHARDED:
            plan = _sharded_plan.plan_sharded(module, {})
            _plans.remember(module, plan, keep_vars=True, compiled=False)
            return plan
        model: torch.nn.Module | None = module
        state = {compiled_key(name): t for name, t in module.state_dict().items()}
    else:
        model, state = None, dict(source)
        if any(isinstance(t, _sharded_plan.DTensor) for t in state.values()):
            return _sharded_plan.plan_sharded(None, state)
    for name, value in state.items():
        _check_entry(name, value)
    if model is not None:
        drop_unsaved(state, model)
    nbytes = sum(tensor_nbytes(t) for t in state.values())
    buffer_nbytes = sum(aligned(tensor_nbytes(t)) for t in state.values())
    on_cuda = any(t.device.type == "cuda" for t in state.values())
    plan = StatePlan(model, state, nbytes, buffer_nbytes, on_cuda)
    if model is not None:
        _plans.remember(model, plan, keep_vars=False, compiled=True)
    return plan


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


def _is_deepspeed_engine(module: torch.nn.Module) -> bool:
    cls = type(module)
    return cls.__name__ == "DeepSpeedEngine" and cls.__module__.startswith("deepspeed")

"""What a plan of a peft model reads of peft: the transformers model inside a ``PeftModel``,
which layers merge as plain LoRA (and why the others do not), the adapters a layer merges,
where a key of a wrapping layer lands in the merged model, and what of a layer besides its
tensors the plan depends on (for ``_adapter_cache``'s check).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from actorsys.snapshot._forms import unsupported


def lora_state(layer: Any) -> object:
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


def wrapper_state(layer: Any) -> object:
    """What a plan reads of a ``modules_to_save`` wrapper besides its modules."""
    return tuple(layer.active_adapters)


def unmergeable(name: str, layer: Any) -> str | None:
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
    if any(a in layer.lora_variant for a in to_merge(layer)):
        variant = "DoRA" if any(layer.use_dora.values()) else "a LoRA variant"
        return f"{variant} (at {name}), which is not merged as plain LoRA"
    return None


def to_merge(layer: Any) -> list[str]:
    """The adapters ``merge_and_unload`` merges into ``layer``: the active ones it holds that
    are not merged already."""
    held = set(layer.lora_A) | set(layer.lora_embedding_A)
    return [a for a in layer.active_adapters if a in held and a not in layer.merged_adapters]


def base_model(module: torch.nn.Module) -> torch.nn.Module:
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


def owner(key: str, layers: Mapping[str, Any]) -> str | None:
    if not any(part in key for part in WRAPPED):
        return None
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in layers:
            return prefix
    return None


def output_name(prefix: str, layer: Any, key: str) -> str | None:
    """Where ``key`` of the wrapping ``layer`` at ``prefix`` lands in the merged model."""
    rest = key[len(prefix) + 1 :]
    if hasattr(layer, "modules_to_save"):
        active = layer.active_adapters
        inner = f"modules_to_save.{active[0]}." if active else "original_module."
        return f"{prefix}.{rest.removeprefix(inner)}" if rest.startswith(inner) else None
    if rest.startswith("base_layer."):
        return f"{prefix}.{rest.removeprefix('base_layer.')}"
    return None


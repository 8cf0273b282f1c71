"""The one place that decides what form a model's weights take, before anything is copied.

Every way of planning a snapshot of a module asks :func:`model_form` first (after unwrapping
data-parallel, ``torch.compile`` and accelerate wrappers): ``DENSE`` (every tensor whole, in
this process), ``ADAPTERS`` (peft adapters over a dense base, exported merged) or ``SHARDED``
(DTensor parameters: FSDP2 ``fully_shard``, tensor parallel; each rank holds its local
shards). A form the weights cannot be copied from as they are raises
:class:`~actorsys.UnsupportedModelError` here, at submit, before anything is admitted:
FSDP1 flat parameters, DeepSpeed ZeRO-3 partitions, quantized bases (bitsandbytes, torchao,
any transformers quantizer), and peft adapter types that cannot be merged.

Cheap: one walk over the modules and one over the parameters and buffers, no tensor data
read. Libraries are recognised by the modules their classes live in, so none is imported
here.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterator

import torch

from actorsys._errors import UnsupportedModelError

SUPPORTED = (
    "supported: a torch module whose tensors are whole (optionally inside DDP, DataParallel, "
    "torch.compile or accelerate's wrappers), FSDP2 / DTensor parameters, and peft LoRA "
    "adapters on such a module; for anything else, write the checkpoint yourself with "
    "submit(step, export=...)"
)


class ModelForm(enum.Enum):
    DENSE = "dense"
    ADAPTERS = "adapters"
    SHARDED = "sharded"


def unsupported(form: str, what: str) -> UnsupportedModelError:
    """The error for ``what`` (a sentence naming the form found), with what is supported."""
    return UnsupportedModelError(form, f"{what} is not supported; {SUPPORTED}")


def model_form(module: torch.nn.Module) -> ModelForm:
    """The form of ``module`` (already unwrapped), or :class:`UnsupportedModelError`.

    One walk over the modules (at every submit, on the trainer's thread). A peft model or
    tuner at the top is ``ADAPTERS`` at once: the adapter plan walks its modules anyway and
    checks each with :func:`check_module` as it goes."""
    if is_peft(module):
        return ModelForm.ADAPTERS
    adapters = sharded = False
    for name, submodule in walk_modules(module):
        sharded = check_module(name, submodule) or sharded
        adapters = adapters or is_peft(submodule)
    if adapters:
        if sharded:
            raise unsupported("adapters-sharded", "peft adapters over sharded (DTensor) parameters")
        return ModelForm.ADAPTERS
    return ModelForm.SHARDED if sharded else ModelForm.DENSE


def walk_modules(module: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """Every submodule with its name, in ``state_dict`` order, a shared one under each of its
    names. ``named_modules`` does the same through nested generators, whose cost grows with
    depth times size; at every submit, on the trainer's thread, a flat walk is worth it."""
    stack: list[tuple[str, torch.nn.Module]] = [("", module)]
    while stack:
        prefix, current = stack.pop()
        yield prefix, current
        children = [
            (f"{prefix}.{name}" if prefix else name, child)
            for name, child in current._modules.items()
            if child is not None
        ]
        stack.extend(reversed(children))


def is_peft(module: torch.nn.Module) -> bool:
    where = type(module).__module__
    return where == "peft" or where.startswith("peft.")


def check_module(name: str, submodule: torch.nn.Module) -> bool:
    """Raise :class:`UnsupportedModelError` if ``submodule`` (at ``name``) or its own
    tensors cannot be copied as they are; True if one of its tensors is a DTensor."""
    cls = type(submodule)
    where = cls.__module__
    if where.startswith("torch.distributed.fsdp") and cls.__name__ == "FullyShardedDataParallel":
        at = name or "the top"
        raise unsupported("fsdp1", f"FSDP1 (FullyShardedDataParallel at {at}, flat parameters)")
    if where.startswith("bitsandbytes"):
        raise unsupported("quantized", f"a bitsandbytes-quantized layer ({cls.__name__} at {name})")
    if submodule.__dict__.get("hf_quantizer") is not None:
        raise unsupported("quantized", f"a quantized transformers model ({cls.__name__})")
    sharded = False
    for tensor_name, tensor in itertools.chain(
        submodule._parameters.items(), submodule._buffers.items()
    ):
        if tensor is not None and _is_sharded(tensor, f"{name}.{tensor_name}" if name else tensor_name):
            sharded = True
    return sharded


def _is_sharded(tensor: torch.Tensor, name: str) -> bool:
    """Whether ``tensor`` is a DTensor; raises for tensors whose data is not all here."""
    cls = type(tensor)
    if "ds_id" in tensor.__dict__:
        raise unsupported("zero3", f"a DeepSpeed ZeRO-3 partitioned parameter ({name})")
    if cls is torch.nn.Parameter or cls is torch.Tensor:
        return False
    where = cls.__module__
    if where.startswith(("bitsandbytes", "torchao")):
        raise unsupported("quantized", f"a quantized tensor ({cls.__name__} at {name})")
    if cls.__name__ == "FlatParameter":
        raise unsupported("fsdp1", f"an FSDP1 flat parameter ({name})")
    return any(base.__name__ == "DTensor" for base in cls.__mro__)

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
    """The form of ``module`` (already unwrapped), or :class:`UnsupportedModelError`."""
    adapters = False
    for name, submodule in module.named_modules():
        cls = type(submodule)
        where = cls.__module__
        if where.startswith("torch.distributed.fsdp") and cls.__name__ == "FullyShardedDataParallel":
            at = name or "the top"
            raise unsupported("fsdp1", f"FSDP1 (FullyShardedDataParallel at {at}, flat parameters)")
        if where.startswith("bitsandbytes"):
            raise unsupported("quantized", f"a bitsandbytes-quantized layer ({cls.__name__} at {name})")
        if getattr(submodule, "hf_quantizer", None) is not None:
            raise unsupported("quantized", f"a quantized transformers model ({cls.__name__})")
        if where == "peft" or where.startswith("peft."):
            adapters = True
    sharded = False
    tensors = itertools.chain(module.named_parameters(), module.named_buffers())
    for name, tensor in tensors:
        cls = type(tensor)
        where = cls.__module__
        if hasattr(tensor, "ds_id"):
            raise unsupported("zero3", f"a DeepSpeed ZeRO-3 partitioned parameter ({name})")
        if where.startswith(("bitsandbytes", "torchao")):
            raise unsupported("quantized", f"a quantized tensor ({cls.__name__} at {name})")
        if cls.__name__ == "FlatParameter":
            raise unsupported("fsdp1", f"an FSDP1 flat parameter ({name})")
        if any(base.__name__ == "DTensor" for base in cls.__mro__):
            sharded = True
    if adapters and sharded:
        raise unsupported("adapters-sharded", "peft adapters over sharded (DTensor) parameters")
    if adapters:
        return ModelForm.ADAPTERS
    if sharded:
        return ModelForm.SHARDED
    return ModelForm.DENSE

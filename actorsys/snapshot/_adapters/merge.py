"""A plan of a peft LoRA model exported merged, and the merge it runs at each point.

:class:`AdapterPlan` says where each tensor of the merged checkpoint comes from: a copied or
kept tensor as it is, or a :class:`Merge` of a base tensor and its adapters' deltas
(``W + scaling * B @ A``, as peft's ``get_delta_weight`` computes them). :func:`assemble` lays
a point's outputs out (the trained tensors copied, the kept base refreshed, a slot of the
point's buffer for each merge) and returns the merges to run in the export thread.
(``_adapters`` makes the plan.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from actorsys.snapshot._adapters.kept import KeptBase
from actorsys.snapshot._conversions import Structure
from actorsys.snapshot._pool.memory import aligned

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
            size = slot_nbytes(shape, dtype)
            slot = buffer[offset : offset + size].view(dtype).view(shape)
            offset += aligned(size)
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


def slot_nbytes(shape: torch.Size, dtype: torch.dtype) -> int:
    """The bytes of a merge's slot: a tensor of ``shape`` and ``dtype``."""
    return shape.numel() * dtype.itemsize

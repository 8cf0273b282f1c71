"""The plan of a snapshot of a sharded model (DTensor parameters: FSDP2 ``fully_shard``,
tensor parallel): which piece of each tensor this rank holds, and whether it writes it. How the
pieces are written into one set of files is :mod:`actorsys.snapshot._sharded.write`.

Which tensors a snapshot holds follows ``save_pretrained`` of the unsharded model: keys in
``_keys_to_ignore_on_save`` are left out, and a tied duplicate (``lm_head.weight`` being the
embeddings' very parameter) is dropped by the same rule as for a plain model, decided on the
parameters' identity so that every rank decides alike (a rank's local shard may be empty).
A replicated placement is written by the ranks at coordinate 0 of that mesh dimension; a
plain tensor (a buffer FSDP2 does not shard) by the evaluating rank.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from actorsys.snapshot import _conversions
from actorsys.snapshot._state_plan import (
    StatePlan,
    _check_entry,
    _tied_patterns,
    aligned,
    tensor_nbytes,
)

__all__ = [
    "SUPPORTED", "DTensor", "Handover", "Piece", "Sharding", "Writer", "converted_message", "plan_sharded",
]

SUPPORTED = (
    "DTensor parameters placed Shard(dim) or Replicate on their device mesh "
    "(FSDP2 fully_shard, tensor parallel)"
)

Writer = Literal["self", "evaluator", "other"]


class Handover(Protocol):
    """How the evaluating rank's export thread meets the other ranks (blocking calls)."""

    def ready(self, directory: str, starts: dict[str, dict[str, int]]) -> None:
        """The files exist at full size: tell the other ranks where to write."""

    def wait_contributions(self, check: Callable[[], None]) -> None:
        """Block until every other rank wrote its ranges; raise (bounded) if one did not."""

    def abandon(self, error: str) -> None:
        """This export failed or was given up: the other ranks need not write."""


@dataclass(frozen=True)
class Piece:
    """What one rank holds of one tensor: the part at ``offset`` of ``local_shape`` within
    the tensor of ``shape``. ``writer``: ``self`` (this rank writes it), ``other`` (another
    rank holds the same replica and writes it), ``evaluator`` (a plain tensor every rank
    holds whole; the evaluating rank writes it)."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    offset: tuple[int, ...]
    writer: Writer

    def writes(self, *, evaluating: bool) -> bool:
        return self.writer == "self" or (self.writer == "evaluator" and evaluating)

    def runs(self) -> list[tuple[int, int]]:
        """The contiguous ranges ``(first element, elements)`` of the whole tensor this piece
        covers, in the order of its own (row-major) elements."""
        shape, local, offset = self.shape, self.local_shape, self.offset
        if not shape:
            return [(0, 1)]
        if 0 in local:
            return []
        k = len(shape)
        while k > 0 and local[k - 1] == shape[k - 1]:
            k -= 1
        if k == 0:
            return [(0, math.prod(shape))]
        inner = math.prod(shape[k:])
        strides = [math.prod(shape[j + 1 :]) for j in range(len(shape))]
        run = local[k - 1] * inner
        runs = []
        for index in itertools.product(*(range(local[j]) for j in range(k - 1))):
            first = sum((offset[j] + i) * strides[j] for j, i in enumerate(index))
            runs.append((first + offset[k - 1] * inner, run))
        return runs


@dataclass(frozen=True)
class Sharding:
    """The pieces of a sharded snapshot this rank holds, by tensor name (state-dict order)."""

    pieces: dict[str, Piece]

    def specs(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        return {name: (p.dtype, p.shape) for name, p in self.pieces.items()}


def plan_sharded(
    model: torch.nn.Module | None, state: Mapping[str, torch.Tensor]
) -> StatePlan:
    """The plan of a snapshot of a sharded ``model`` (or state dict of DTensors, with ``model``
    None): entries are this rank's local shards (what it copies), ``nbytes`` the bytes of the
    whole snapshot, ``buffer_nbytes`` what this rank's copy needs. Raises ``ValueError``
    naming an entry whose placement cannot be written (``Partial``, a strided shard)."""
    if model is not None:
        state = _without_tied_duplicates(model, dict(model.state_dict(keep_vars=True)))
        if _conversions.known(model):
            raise ValueError(converted_message(model))
    pieces: dict[str, Piece] = {}
    entries: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        piece, local = _piece(name, value)
        pieces[name] = piece
        if piece.writer != "other":
            entries[name] = local
    nbytes = sum(math.prod(p.shape) * p.dtype.itemsize for p in pieces.values())
    buffer_nbytes = sum(aligned(tensor_nbytes(t)) for t in entries.values())
    on_cuda = any(t.device.type == "cuda" for t in entries.values())
    return StatePlan(model, entries, nbytes, buffer_nbytes, on_cuda, sharding=Sharding(pieces))


def converted_message(model: object) -> str:
    """Why the snapshot of ``model``, which converts its weights at load, cannot be sharded."""
    return (
        f"{type(model).__name__} converts its weights at load (fused experts); a sharded "
        "snapshot of it is not supported: gather it yourself with export="
    )


def _without_tied_duplicates(
    model: torch.nn.Module, state: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    for name in getattr(model, "_keys_to_ignore_on_save", None) or ():
        state.pop(name, None)
    by_parameter: dict[int, list[str]] = defaultdict(list)
    for name, value in state.items():
        by_parameter[id(value)].append(name)
    patterns: list[str] | None = None
    for names in by_parameter.values():
        if len(names) < 2:
            continue
        if patterns is None:
            patterns = _tied_patterns(model)
        tied = [n for n in sorted(names) if any(re.search(p, n) for p in patterns)]
        for name in tied if len(tied) < len(names) else tied[:-1]:
            del state[name]
    return {name: value.detach() for name, value in state.items()}


def _piece(name: str, value: torch.Tensor) -> tuple[Piece, torch.Tensor]:
    if not isinstance(value, DTensor):
        _check_entry(name, value)
        shape = tuple(value.shape)
        return Piece(value.dtype, shape, shape, (0,) * len(shape), "evaluator"), value
    local = value.to_local()
    _check_entry(name, local)
    mesh, placements = value.device_mesh, value.placements
    if not all(type(p) in (Shard, Replicate) for p in placements):
        kinds = ", ".join(str(p) for p in placements)
        raise ValueError(f"state_dict[{name!r}] is a DTensor placed {kinds}; supported: {SUPPORTED}")
    shape = tuple(value.shape)
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return Piece(value.dtype, shape, (0,) * len(shape), (0,) * len(shape), "other"), local
    local_shape, offset = _local_shape_and_offset(shape, mesh, tuple(placements))
    if tuple(local.shape) != tuple(local_shape):
        raise ValueError(
            f"state_dict[{name!r}]: the local shard has shape {tuple(local.shape)}, its "
            f"placement says {tuple(local_shape)}; supported: {SUPPORTED}"
        )
    replica = all(
        c == 0 for c, p in zip(coordinate, placements, strict=True) if isinstance(p, Replicate)
    )
    writer: Writer = "self" if replica else "other"
    return Piece(value.dtype, shape, tuple(local_shape), tuple(offset), writer), local


@functools.lru_cache(maxsize=4096)
def _local_shape_and_offset(
    shape: tuple[int, ...], mesh: Any, placements: tuple[Any, ...]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Where this rank's shard lies (cached: it costs about a millisecond per tensor, and a
    model's placements do not change between points)."""
    local_shape, offset = compute_local_shape_and_global_offset(shape, mesh, placements)
    return tuple(local_shape), tuple(offset)

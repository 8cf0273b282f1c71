"""Snapshots of sharded models: parameters that are DTensors (FSDP2 ``fully_shard``, tensor
parallel), written by every rank into one set of files without gathering the weights.

The design. A safetensors file is a header followed by each tensor's bytes, row-major, at an
offset the header fixes; the header depends only on the names, dtypes and global shapes, which
every rank knows. A shard of a tensor along dim 0 (what FSDP2 makes) is therefore one
contiguous byte range of its tensor in the file, and any other ``Shard``/``Replicate``
placement is a set of such ranges (one per row of the leading dims). So at submit each rank
copies only its local shards into its own buffers (the trainer's stall is one local copy);
later, off the trainer's thread, the evaluating rank creates the files at their full size with
their headers and announces the directory (a small control message, see
``actorsys._core.collective``), and every rank writes its own ranges into them with
``pwrite`` and fsyncs them. The evaluating rank waits (bounded) until every rank said its
ranges are written, then writes the index and the snapshot is complete: byte for byte what a
single process writes for the unsharded model. Nothing is gathered and nothing is copied
twice; a dead rank costs a bounded wait and a skipped point.

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
import json
import math
import os
import re
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
from huggingface_hub import split_state_dict_into_shards_factory
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from actorsys.snapshot import _conversions
from actorsys.snapshot._model_files import (
    INDEX_NAME,
    SHARD_PATTERN,
    _write_text,
    fsync_tree,
    write_model_files,
)
from actorsys.snapshot._safetensors import CHUNK_BYTES, file_header, raw_bytes
from actorsys.snapshot._tensors import StatePlan, _check_entry, _tied_patterns, aligned, tensor_nbytes

if TYPE_CHECKING:
    from actorsys.snapshot._capture import CapturedWeights

SUPPORTED = (
    "DTensor parameters placed Shard(dim) or Replicate on their device mesh "
    "(FSDP2 fully_shard, tensor parallel)"
)

Writer = Literal["self", "evaluator", "other"]


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


class Handover(Protocol):
    """How the evaluating rank's export thread meets the other ranks (blocking calls)."""

    def ready(self, directory: str, starts: dict[str, dict[str, int]]) -> None:
        """The files exist at full size: tell the other ranks where to write."""

    def wait_contributions(self, check: Callable[[], None]) -> None:
        """Block until every other rank wrote its ranges; raise (bounded) if one did not."""

    def abandon(self, error: str) -> None:
        """This export failed or was given up: the other ranks need not write."""


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
            raise ValueError(_converted(model))
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


def _converted(model: object) -> str:
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


@dataclass(frozen=True)
class FileLayout:
    """The files of a sharded snapshot: per file, its header bytes, its size, and where each
    of its tensors starts (absolute offsets); the index, when there are several files."""

    headers: dict[str, bytes]
    sizes: dict[str, int]
    starts: dict[str, dict[str, int]]
    index: dict[str, object] | None


def file_layout(sharding: Sharding, *, max_shard_size: int, num_parameters: int) -> FileLayout:
    """Split the snapshot into files as ``write_weights`` does (huggingface_hub's splitter on
    the global sizes) and lay each file out as safetensors does."""
    specs = sharding.specs()
    metas = {name: torch.empty(shape, dtype=dtype, device="meta") for name, (dtype, shape) in specs.items()}
    split = split_state_dict_into_shards_factory(
        metas,
        get_storage_size=tensor_nbytes,
        filename_pattern=SHARD_PATTERN,
        max_shard_size=max_shard_size,
    )
    headers, sizes, starts = {}, {}, {}
    for filename, names in split.filename_to_tensors.items():
        head, relative = file_header({n: specs[n] for n in names}, {"format": "pt"})
        headers[filename] = head
        starts[filename] = {n: len(head) + offset for n, offset in relative.items()}
        sizes[filename] = len(head) + sum(math.prod(specs[n][1]) * specs[n][0].itemsize for n in names)
    index: dict[str, object] | None = None
    if split.is_sharded:
        index = {
            "metadata": {"total_parameters": num_parameters, **split.metadata},
            "weight_map": split.tensor_to_filename,
        }
    return FileLayout(headers, sizes, starts, index)


def write_sharded_snapshot(
    weights: CapturedWeights,
    directory: str,
    *,
    base_checkpoint: str | None,
    max_shard_size: int,
) -> None:
    """On the evaluating rank, in the export thread: the whole snapshot of a sharded model
    into ``directory``: its config files, the weight files at full size with their headers,
    this rank's ranges, every other rank's ranges (written by them, waited for through
    ``weights.handover``), the index. Blocking; bounded by the handover's wait. Every file is
    fsync'd."""
    sharding, handover = weights.sharding, weights.handover
    assert sharding is not None and handover is not None
    try:
        if weights.resolve_converter() is not None:
            raise ValueError(_converted(weights.converter))
        write_model_files(weights, directory, base_checkpoint)
        layout = file_layout(
            sharding, max_shard_size=max_shard_size, num_parameters=weights.num_parameters
        )
        for filename, head in layout.headers.items():
            fd = os.open(os.path.join(directory, filename), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            try:
                os.pwrite(fd, head, 0)
                os.ftruncate(fd, layout.sizes[filename])
            finally:
                os.close(fd)
        handover.ready(directory, layout.starts)
        write_pieces(weights, directory, layout.starts, evaluating=True, check=weights.check_live)
        handover.wait_contributions(weights.check_live)
        if layout.index is not None:
            _write_text(
                os.path.join(directory, INDEX_NAME),
                json.dumps(layout.index, indent=2, sort_keys=True) + "\n",
            )
        fsync_tree(directory)
    except BaseException as exc:
        handover.abandon(f"{type(exc).__name__}: {exc}")
        raise


def write_pieces(
    weights: CapturedWeights,
    directory: str,
    starts: Mapping[str, Mapping[str, int]],
    *,
    evaluating: bool,
    check: Callable[[], None],
) -> None:
    """Write this rank's ranges of the files in ``directory`` (which the evaluating rank
    created at full size; they are never created here, so a directory removed meanwhile is an
    ``OSError``, not a stray file), then fsync them. ``check()`` runs before every chunk."""
    sharding = weights.sharding
    assert sharding is not None
    for filename, names in starts.items():
        unknown = [n for n in names if n not in sharding.pieces]
        if unknown:
            raise ValueError(f"{filename}: no tensor {unknown[0][:80]!r} in this model")
        mine = [n for n in names if sharding.pieces[n].writes(evaluating=evaluating)]
        if not mine:
            continue
        fd = os.open(os.path.join(directory, filename), os.O_WRONLY | os.O_NOFOLLOW)
        try:
            size = os.fstat(fd).st_size
            for name in mine:
                piece = sharding.pieces[name]
                end = names[name] + max(
                    ((first + count) * piece.dtype.itemsize for first, count in piece.runs()),
                    default=0,
                )
                if names[name] < 0 or end > size:
                    raise ValueError(f"{filename}: the range of {name} ({names[name]}..{end}) "
                                     f"is not inside the file ({size} bytes)")
            for name in mine:
                _write_piece(fd, names[name], sharding.pieces[name], weights.tensors[name], check)
            check()
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_piece(
    fd: int, start: int, piece: Piece, tensor: torch.Tensor, check: Callable[[], None]
) -> None:
    data = raw_bytes(tensor)
    size = piece.dtype.itemsize
    position = 0
    for first, count in piece.runs():
        nbytes = count * size
        at = start + first * size
        for chunk in range(0, nbytes, CHUNK_BYTES):
            check()
            end = min(chunk + CHUNK_BYTES, nbytes)
            os.pwrite(fd, data[position + chunk : position + end].data, at + chunk)
        position += nbytes

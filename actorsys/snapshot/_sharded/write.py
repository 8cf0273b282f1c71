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
``actorsys._core.collective.protocol``), and every rank writes its own ranges into them with
``pwrite`` and fsyncs them. The evaluating rank waits (bounded) until every rank said its
ranges are written, then writes the index and the snapshot is complete: byte for byte what a
single process writes for the unsharded model. Nothing is gathered and nothing is copied
twice; a dead rank costs a bounded wait and a skipped point.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from huggingface_hub import split_state_dict_into_shards_factory

from actorsys.snapshot._sharded.plan import Handover, Piece, Sharding, converted_message
from actorsys.snapshot._state_plan import tensor_nbytes
from actorsys.snapshot._write.model_files import (
    INDEX_NAME,
    SHARD_PATTERN,
    _write_text,
    fsync_tree,
    write_model_files,
)
from actorsys.snapshot._write.safetensors import CHUNK_BYTES, file_header, raw_bytes

if TYPE_CHECKING:
    from actorsys.snapshot._capture import CapturedWeights

__all__ = [
    "FileLayout",
    "Handover",
    "Piece",
    "Sharding",
    "file_layout",
    "write_pieces",
    "write_sharded_snapshot",
]


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
            raise ValueError(converted_message(weights.converter))
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

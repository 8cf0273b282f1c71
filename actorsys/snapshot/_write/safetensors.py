"""The safetensors format, written straight from the memory the pipeline owns.

``safetensors.torch.save_file`` first turns every tensor of a file into a ``bytes`` object: a
second full copy of the shard in memory, on top of the captured one. This writer streams each
tensor's bytes from where they lie instead, in chunks, so a write adds no memory beyond the
page cache. The layout is safetensors' own (an 8-byte little-endian header length, a JSON
header padded with spaces to 8 bytes, the tensors sorted by dtype then name): the files are
byte-identical to ``save_file``'s.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Callable, Mapping

import numpy as np
import torch

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.float8_e5m2: "F8_E5M2",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.int16: "I16",
    torch.uint16: "U16",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int32: "I32",
    torch.uint32: "U32",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.uint64: "U64",
}
"""The dtypes safetensors holds, in the order of its ``Dtype`` enum (files list the higher
ones first)."""

_RANK = {dtype: rank for rank, dtype in enumerate(DTYPE_NAMES)}

CHUNK_BYTES = 64 * 1024 * 1024
"""Bytes written between two checks that the write is still wanted."""


def write_file(
    path: str,
    tensors: Mapping[str, torch.Tensor],
    *,
    metadata: Mapping[str, str],
    check: Callable[[], None],
) -> None:
    """Write ``tensors`` (on the CPU) to a new safetensors file at ``path`` and fsync it.

    Blocking (disk I/O). ``check()`` runs before every chunk of at most ``CHUNK_BYTES``; it
    raises to stop a write nobody wants any more. An ``OSError`` (ENOSPC, EACCES, a vanished
    directory) propagates; the caller removes the partial file with its directory.
    """
    if sys.byteorder != "little":
        raise RuntimeError("safetensors files are little-endian; this host is big-endian")
    head, offsets = file_header(
        {name: (t.dtype, tuple(t.shape)) for name, t in tensors.items()}, metadata
    )
    ordered = sorted(tensors.items(), key=lambda item: offsets[item[0]])
    with open(path, "wb") as f:
        f.write(head)
        for _, tensor in ordered:
            data = raw_bytes(tensor)
            for start in range(0, len(data), CHUNK_BYTES):
                check()
                f.write(data[start : start + CHUNK_BYTES].data)
        check()
        f.flush()
        os.fsync(f.fileno())


def file_header(
    specs: Mapping[str, tuple[torch.dtype, tuple[int, ...]]], metadata: Mapping[str, str]
) -> tuple[bytes, dict[str, int]]:
    """The first bytes of a safetensors file holding tensors of these ``(dtype, shape)``: the
    length prefix and the padded JSON header; and where each tensor's data starts, counted
    from the end of those bytes. The layout depends on the specs alone, so every rank of a
    sharded job computes the same one."""
    ordered = sorted(specs.items(), key=lambda item: (-_RANK[item[1][0]], item[0]))
    header: dict[str, object] = {"__metadata__": dict(metadata)}
    starts: dict[str, int] = {}
    offset = 0
    for name, (dtype, shape) in ordered:
        numel = 1
        for size in shape:
            numel *= size
        end = offset + numel * dtype.itemsize
        header[name] = {"dtype": DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, end]}
        starts[name] = offset
        offset = end
    encoded = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    return struct.pack("<Q", len(encoded)) + encoded, starts


def raw_bytes(tensor: torch.Tensor) -> np.ndarray:
    """The bytes of a CPU tensor as a flat uint8 array, without a copy when it is contiguous."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy()

"""The layout of a sharded snapshot, in one process: which byte ranges a shard covers, and
that the files' headers are those ``write_weights`` writes for the whole tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from actorsys.snapshot import write_weights
from actorsys.snapshot._sharded.write import Piece, Sharding, file_layout


def piece(shape: tuple[int, ...], local: tuple[int, ...], offset: tuple[int, ...]) -> Piece:
    return Piece(torch.float32, shape, local, offset, "self")


def test_a_dim0_shard_is_one_contiguous_range() -> None:
    assert piece((5, 3), (2, 3), (3, 0)).runs() == [(9, 6)]


def test_a_dim1_shard_is_one_range_per_row() -> None:
    assert piece((2, 4), (2, 2), (0, 2)).runs() == [(2, 2), (6, 2)]


def test_an_empty_shard_covers_nothing_and_a_scalar_one_element() -> None:
    assert piece((4, 3), (0, 3), (4, 0)).runs() == []
    assert piece((), (), ()).runs() == [(0, 1)]


@pytest.mark.parametrize(
    ("shape", "dim", "parts"), [((7, 5), 0, 3), ((7, 5), 1, 2), ((3, 6, 4), 1, 4), ((9,), 0, 4)]
)
def test_the_shards_of_uneven_chunks_rebuild_the_tensor(
    shape: tuple[int, ...], dim: int, parts: int
) -> None:
    whole = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
    rebuilt = torch.full((whole.numel(),), -1.0)
    start = 0
    for chunk in torch.chunk(whole, parts, dim=dim):
        offset = tuple(start if d == dim else 0 for d in range(len(shape)))
        flat = chunk.contiguous().reshape(-1)
        position = 0
        for first, count in piece(shape, tuple(chunk.shape), offset).runs():
            rebuilt[first : first + count] = flat[position : position + count]
            position += count
        assert position == chunk.numel()
        start += chunk.shape[dim]
    assert torch.equal(rebuilt.reshape(shape), whole)


def test_file_headers_and_offsets_are_those_write_weights_writes(tmp_path: Path) -> None:
    tensors = {
        "b.weight": torch.randn(3, 5),
        "a.weight": torch.randn(4, dtype=torch.bfloat16),
        "c.bias": torch.randn(2, 2, 2),
    }
    sharding = Sharding({
        name: Piece(t.dtype, tuple(t.shape), tuple(t.shape), (0,) * t.dim(), "self")
        for name, t in tensors.items()
    })
    max_shard_size = 70
    written = write_weights(tensors, str(tmp_path), max_shard_size=max_shard_size, num_parameters=27)
    layout = file_layout(sharding, max_shard_size=max_shard_size, num_parameters=27)
    assert sorted(layout.headers) == sorted(n for n in written if n.endswith(".safetensors"))
    assert layout.index is not None
    for filename, head in layout.headers.items():
        data = (tmp_path / filename).read_bytes()
        assert data[: len(head)] == head
        assert len(data) == layout.sizes[filename]
        for name, start in layout.starts[filename].items():
            raw = tensors[name].contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
            assert data[start : start + len(raw)] == raw

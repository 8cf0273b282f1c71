"""Memory for buffer sets faulted in ahead of a copy, and the record of one being prepared.

Faulting a set in costs about one copy into fresh memory (page faults); done ahead, in a
thread that is not the trainer's, a later copy into the set runs at the speed of a copy into
memory already mapped. Measured on a shared 2-core machine (noisy): populating right before
the copy, on the copying thread, was slower than letting the copy fault the pages in, so a
copy with no set prepared does just that; huge pages (``MADV_HUGEPAGE``) made faulting in
slower as often as faster, so they are not asked for.

Pageable memory is faulted in a chunk at a time, checking a stop flag in between, so that a
pool that closes (or a process that exits) stops its preparation within one chunk instead of
leaving a thread inside a long torch op (see :mod:`actorsys.runtime.exit_guard`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

ALIGNMENT = 64
"""Byte alignment of every tensor inside a buffer set (any dtype can be viewed there)."""


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`ALIGNMENT`: where the next tensor of a set starts."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


class Preparation:
    """A set being allocated and faulted in; a lease may claim it before it is done."""

    def __init__(self, nbytes: int, pinned: bool) -> None:
        self.nbytes = nbytes
        self.pinned = pinned
        self.claimed = False
        self.done = threading.Event()
        self.buffer: torch.Tensor | None = None

    @property
    def description(self) -> str:
        """How this preparation is named where it is still running (``stuck_threads``)."""
        return f"buffer preparation of {self.nbytes} bytes"


FAULT_CHUNK_BYTES = 64 * 2**20
"""Bytes zeroed by one torch op while a set is faulted in: tens of milliseconds."""


def allocate_faulted(
    nbytes: int, *, pinned: bool, stopped: Callable[[], bool] | None = None
) -> torch.Tensor | None:
    """A flat uint8 buffer of ``nbytes`` whose pages are all mapped already, or None if
    ``stopped()`` turned true before it was done.

    Blocks the calling thread for the page faults. Pinned memory (with CUDA) is mapped when
    it is page-locked, in one call that cannot be stopped. Pageable memory is faulted in by
    writing zeros with torch, :data:`FAULT_CHUNK_BYTES` at a time, ``stopped()`` asked
    before each chunk. Torch releases the GIL while it writes: an anonymous mapping with
    ``MAP_POPULATE`` costs about the same but holds the GIL for the whole mmap call
    (measured: 138 ms for 536 MB), stalling every other Python thread, the trainer's too.
    """
    if pinned and torch.cuda.is_available():
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    buffer = torch.empty(nbytes, dtype=torch.uint8)
    for start in range(0, nbytes, FAULT_CHUNK_BYTES):
        if stopped is not None and stopped():
            return None
        buffer[start:start + FAULT_CHUNK_BYTES].zero_()
    return buffer

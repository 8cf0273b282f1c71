"""Memory for buffer sets faulted in ahead of a copy, and the record of one being prepared.

Faulting a set in costs about one copy into fresh memory (page faults); done ahead, in a
thread that is not the trainer's, a later copy into the set runs at the speed of a copy into
memory already mapped. Measured on a shared 2-core machine (noisy): populating right before
the copy, on the copying thread, was slower than letting the copy fault the pages in, so a
copy with no set prepared does just that; huge pages (``MADV_HUGEPAGE``) made faulting in
slower as often as faster, so they are not asked for.
"""

from __future__ import annotations

import threading

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


def allocate_faulted(nbytes: int, *, pinned: bool) -> torch.Tensor:
    """A flat uint8 buffer of ``nbytes`` whose pages are all mapped already.

    Pinned memory (with CUDA) is mapped when it is page-locked. Pageable memory is faulted in
    by writing zeros with torch, which releases the GIL while it writes: an anonymous mapping
    with ``MAP_POPULATE`` costs about the same but holds the GIL for the whole mmap call
    (measured: 138 ms for 536 MB), stalling every other Python thread, the trainer's too.
    """
    if pinned and torch.cuda.is_available():
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    buffer = torch.empty(nbytes, dtype=torch.uint8)
    buffer.zero_()
    return buffer

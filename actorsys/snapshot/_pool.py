"""Reused CPU buffers for weight copies: at most ``max_sets`` of them, leased one per point.

Copying weights into fresh memory is dominated by page faults: for a 412 MB state dict, 1-4 s
when the memory stays alive, against 25-45 ms into memory already mapped (see DESIGN.md). A
non-blocking export that allocated per point would stall the trainer longer than the blocking
save it replaces, so each point leases a buffer set that earlier points already faulted in.
A set is one flat byte buffer; the capture lays the tensors out in it. Sets for weights that
live on CUDA are pinned (page-locked), so device-to-host copies run asynchronously.

The pool is thread-safe: the trainer's thread (or a host thread) leases and fills a set, the
trio thread releases it, and an export thread abandoned at a timeout may be the last to let go.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PoolStatistics:
    """``sets``: buffer sets alive or promised to a lease; ``free``: of those, idle;
    ``leases``: leases granted so far; ``allocations``: sets allocated so far (a lease that
    reuses a set allocates nothing); ``free_nbytes``: bytes held by idle sets."""

    sets: int
    free: int
    leases: int
    allocations: int
    free_nbytes: int


class BufferPool:
    """At most ``max_sets`` buffer sets, reused across leases.

    ``on_free()`` is called (from whichever thread gives a set back) each time a set becomes
    available, so a waiter elsewhere can try again.
    """

    def __init__(self, max_sets: int, *, on_free: Callable[[], None] | None = None) -> None:
        if max_sets < 1:
            raise ValueError(f"BufferPool(max_sets): expected an integer >= 1, got {max_sets!r}")
        self.max_sets = max_sets
        self._on_free = on_free
        self._lock = threading.Lock()
        self._free: list[torch.Tensor] = []
        self._sets = 0
        self._leases = 0
        self._allocations = 0
        self._closed = False

    def try_lease(self, nbytes: int, *, pinned: bool) -> BufferLease | None:
        """A lease on a set of at least ``nbytes``, or None when every set is leased.

        Never blocks. Prefers the smallest idle set that fits; an idle set that does not fit
        (too small, or pageable where pinned is wanted) is dropped and replaced, so the pool
        never holds more than ``max_sets`` sets. The memory of a new set is allocated by
        ``BufferLease.buffer``, in the thread that copies into it.
        """
        with self._lock:
            if self._closed:
                return None
            fitting = [
                b for b in self._free if b.numel() >= nbytes and (b.is_pinned() or not pinned)
            ]
            reused: torch.Tensor | None = None
            if fitting:
                reused = min(fitting, key=lambda b: b.numel())
                self._free.remove(reused)
            elif self._sets < self.max_sets:
                self._sets += 1
            elif self._free:
                self._free.pop(0)
            else:
                return None
            self._leases += 1
        return BufferLease(nbytes, pinned=pinned, pool=self, buffer=reused)

    def close(self) -> None:
        """Drop the idle sets; sets still leased are dropped when given back."""
        with self._lock:
            self._closed = True
            self._sets -= len(self._free)
            self._free.clear()

    def statistics(self) -> PoolStatistics:
        with self._lock:
            return PoolStatistics(
                sets=self._sets,
                free=len(self._free),
                leases=self._leases,
                allocations=self._allocations,
                free_nbytes=sum(b.numel() for b in self._free),
            )

    def _allocated(self) -> None:
        with self._lock:
            self._allocations += 1

    def _give_back(self, buffer: torch.Tensor | None) -> None:
        with self._lock:
            if buffer is not None and not self._closed:
                self._free.append(buffer)
            else:
                self._sets -= 1
        if self._on_free is not None:
            self._on_free()


class BufferLease:
    """One buffer set, held from lease to ``give_back``. Without a pool, a one-off buffer."""

    def __init__(
        self,
        nbytes: int,
        *,
        pinned: bool,
        pool: BufferPool | None = None,
        buffer: torch.Tensor | None = None,
    ) -> None:
        self.nbytes = nbytes
        self.pinned = pinned
        self._pool = pool
        self._buffer = buffer
        self._lock = threading.Lock()
        self._returned = False

    def buffer(self) -> torch.Tensor:
        """The leased set as a flat uint8 tensor of at least ``nbytes``.

        Allocates it on first use when the lease got no idle set: pinned memory when the lease
        asked for it (needs CUDA), else ordinary memory.
        """
        with self._lock:
            if self._returned:
                raise RuntimeError("this buffer lease was given back")
            if self._buffer is None:
                pin = self.pinned and torch.cuda.is_available()
                self._buffer = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=pin)
                if self._pool is not None:
                    self._pool._allocated()
            return self._buffer

    def give_back(self) -> None:
        """Return the set to its pool (or free it). Idempotent; the caller must hold no view of
        the set any more."""
        with self._lock:
            if self._returned:
                return
            self._returned = True
            buffer, self._buffer = self._buffer, None
        if self._pool is not None:
            self._pool._give_back(buffer)

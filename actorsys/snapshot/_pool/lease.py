"""BufferLease: one buffer set of a :class:`~actorsys.snapshot._pool.pool.BufferPool`, held by
one point from its lease to ``give_back`` (or a one-off buffer, without a pool).

The set's memory comes to the lease in one of three ways: an idle set the pool reused, a set
the pool was preparing (the lease waits for it at :meth:`BufferLease.buffer`), or none, when
the copy allocates it itself in the thread that copies. Thread-safe: the lease is filled in
one thread and given back from another.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

import torch

from actorsys.snapshot._adapters.kept import KeptBase
from actorsys.snapshot._pool.memory import Preparation


class LeaseOwner(Protocol):
    """What a lease asks of the pool it came from (a
    :class:`~actorsys.snapshot._pool.pool.BufferPool`). Thread-safe, never blocking."""

    @property
    def kept(self) -> KeptBase:
        """The frozen base kept across points beside the sets."""

    @property
    def prepares_spares(self) -> bool:
        """Whether the pool prepares its other sets after a copy into one."""

    def prepare_spares(self, nbytes: int, *, pinned: bool) -> object:
        """Prepare the other sets at ``nbytes``, in the background."""

    def note_allocated(self) -> None:
        """A lease's copy allocated its set itself."""

    def views_of(
        self,
        buffer: torch.Tensor,
        layout: object,
        lay_out: Callable[[torch.Tensor], dict[str, torch.Tensor]],
    ) -> dict[str, torch.Tensor]:
        """``buffer``'s views for ``layout``, kept from an earlier point or made now."""

    def unclaim(self, preparation: Preparation) -> bool:
        """Hand a claimed preparation back; True if it is still under way."""

    def take_back(self, buffer: torch.Tensor | None) -> None:
        """A lease's set (None: one it never allocated) returns to the pool."""


class BufferLease:
    """One buffer set, held from lease to ``give_back``. Without a pool, a one-off buffer."""

    def __init__(
        self,
        nbytes: int,
        *,
        pinned: bool,
        pool: LeaseOwner | None = None,
        buffer: torch.Tensor | None = None,
        preparation: Preparation | None = None,
    ) -> None:
        self.nbytes = nbytes
        self.pinned = pinned
        self._pool = pool
        self._buffer = buffer
        self._preparation = preparation
        self._lock = threading.Lock()
        self._returned = False

    @property
    def pool(self) -> LeaseOwner | None:
        """The pool this lease came from (None for a one-off buffer)."""
        return self._pool

    @property
    def fresh(self) -> bool:
        """Whether this lease got no set faulted in ahead: its copy faults the memory in."""
        return self._buffer is None and self._preparation is None

    def buffer(self) -> torch.Tensor:
        """The leased set as a flat uint8 tensor of at least ``nbytes``.

        Waits for the set if the lease took one still being prepared. Allocates it on first
        use when the lease got no set: pinned memory when the lease asked for it (needs
        CUDA), else ordinary memory, which the copy then faults in.
        """
        preparation = self._preparation
        if preparation is not None:
            preparation.done.wait()
        with self._lock:
            if self._returned:
                raise RuntimeError("this buffer lease was given back")
            if self._buffer is None and preparation is not None:
                self._buffer = preparation.buffer
                self._preparation = None
            if self._buffer is None:
                pin = self.pinned and torch.cuda.is_available()
                self._buffer = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=pin)
                if self._pool is not None:
                    self._pool.note_allocated()
            return self._buffer

    def views(
        self, layout: object | None, lay_out: Callable[[torch.Tensor], dict[str, torch.Tensor]]
    ) -> dict[str, torch.Tensor]:
        """``lay_out(self.buffer())``: the set's views for a plan's entries, shared with later
        leases of this set. A pooled set keeps the views made for ``layout`` (an object that
        stands for one layout of entries: names, dtypes, shapes, in order; None: keep none),
        so that a later point with the same layout in the same set makes no views: about
        25 us an entry, on the trainer's stall. The caller must not change them (it may
        write their data)."""
        buffer = self.buffer()
        if self._pool is None or layout is None:
            return lay_out(buffer)
        return self._pool.views_of(buffer, layout, lay_out)

    def prepare_spares(self) -> None:
        """After a copy into this set: let the pool prepare its other sets at this size, in
        the background, if it is set up to. Never blocks."""
        pool = self._pool
        if pool is not None and pool.prepares_spares:
            pool.prepare_spares(self.nbytes, pinned=self.pinned)

    def give_back(self) -> None:
        """Return the set to its pool (or free it). Idempotent; the caller must hold no view of
        the set any more. Never blocks: a set still being prepared goes to the pool when done."""
        with self._lock:
            if self._returned:
                return
            self._returned = True
            buffer, self._buffer = self._buffer, None
            preparation, self._preparation = self._preparation, None
        if self._pool is None:
            return
        if buffer is None and preparation is not None:
            if self._pool.unclaim(preparation):
                return
            buffer = preparation.buffer
        self._pool.take_back(buffer)

"""Reused CPU buffers for weight copies: at most ``max_sets`` of them, leased one per point.

Copying weights into fresh memory is dominated by page faults: for a 412 MB state dict, 1-4 s
when the memory stays alive, against 25-45 ms into memory already mapped (``bench/export.py``
measures the first point's copy against a warm one). A non-blocking export that allocated per
point would stall the trainer longer than the blocking save it replaces, so each point leases
a buffer set that earlier points already faulted in.
A set is one flat byte buffer; the capture lays the tensors out in it. Sets for weights that
live on CUDA are pinned (page-locked), so device-to-host copies run asynchronously.

Sets can also be *prepared*: allocated and faulted in ahead of any copy, by ``prepare`` (which
blocks its caller) or by ``prepare_spares`` (in a background thread, once the first copy
showed how large a set must be). A lease that finds a set still being prepared takes it and
waits for it at ``BufferLease.buffer``, never longer than faulting the set in itself.
``close`` stops the preparations under way within a chunk of faulting in and can wait for
them: a thread left inside torch when the interpreter finalizes aborts the process (see
:mod:`actorsys.runtime.exit_guard`, which stops them at exit too).

The pool is thread-safe: the trainer's thread (or a host thread) leases and fills a set, the
trio thread releases it, an export thread abandoned at a timeout may be the last to let go,
and a preparing thread adds sets.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch

from actorsys.outcome import PoolStatistics
from actorsys.runtime import exit_guard
from actorsys.snapshot._adapters.kept import KeptBase
from actorsys.snapshot._pool.lease import BufferLease
from actorsys.snapshot._pool.memory import Preparation, allocate_faulted

log = logging.getLogger("actorsys")


class BufferPool:
    """At most ``max_sets`` buffer sets, reused across leases.

    ``on_free()`` is called (from whichever thread gives a set back or finishes preparing one)
    each time a set becomes available, so a waiter elsewhere can try again. With
    ``prepare_spares``, the first copy into a set of a new size starts a background thread that
    prepares the other sets at that size, so a later point never faults memory in.

    ``kept`` is the frozen base of a peft model, kept across points beside the sets (see
    ``_kept``); it is not leased and does not count against ``max_sets``.
    """

    def __init__(
        self,
        max_sets: int,
        *,
        on_free: Callable[[], None] | None = None,
        prepare_spares: bool = False,
    ) -> None:
        if max_sets < 1:
            raise ValueError(f"BufferPool(max_sets): expected an integer >= 1, got {max_sets!r}")
        self.max_sets = max_sets
        self.prepares_spares = prepare_spares
        self._on_free = on_free
        self._lock = threading.Lock()
        self._free: list[torch.Tensor] = []
        self._preparing: list[Preparation] = []
        self._preparer: threading.Thread | None = None
        self._sets = 0
        self._leases = 0
        self._allocations = 0
        self._prepared = 0
        self._closed = False
        self._stop = threading.Event()
        """Set by ``close`` (or at exit): preparations stop at their next chunk, none starts."""
        self._layouts: dict[int, tuple[torch.Tensor, object, dict[str, torch.Tensor]]] = {}
        """A set's views laid out for one plan (see ``BufferLease.views``), by the set's id.
        An entry holds its set, so the id is not reused while it is there; it goes when the
        pool drops the set (``_drop``)."""
        self.kept = KeptBase()

    def try_lease(self, nbytes: int, *, pinned: bool) -> BufferLease | None:
        """A lease on a set of at least ``nbytes``, or None when every set is leased.

        Never blocks. Prefers the smallest idle set that fits, then a set being prepared that
        fits; an idle set that does not fit (too small, or pageable where pinned is wanted) is
        dropped and replaced, so the pool never holds more than ``max_sets`` sets. The memory
        of a new set is allocated by ``BufferLease.buffer``, in the thread that copies into it.
        """
        with self._lock:
            if self._closed:
                return None
            fitting = [b for b in self._free if _fits(b, nbytes, pinned)]
            reused: torch.Tensor | None = None
            preparation: Preparation | None = None
            if fitting:
                reused = min(fitting, key=lambda b: b.numel())
                self._free.remove(reused)
            elif claimable := [
                p for p in self._preparing
                if not p.claimed and p.nbytes >= nbytes and (p.pinned or not pinned)
            ]:
                preparation = claimable[0]
                preparation.claimed = True
            elif self._sets < self.max_sets:
                self._sets += 1
            elif self._free:
                self._drop(self._free.pop(0))
            else:
                return None
            self._leases += 1
        return BufferLease(nbytes, pinned=pinned, pool=self, buffer=reused, preparation=preparation)

    def prepare(self, nbytes: int, *, pinned: bool) -> int:
        """Make every set of the pool one of at least ``nbytes``, allocated and faulted in.

        Blocks the calling thread for the allocations (page faults: about one copy of
        ``nbytes`` into fresh memory per set), and until preparations already under way are
        done. Idle sets that do not fit are replaced; leased sets are left alone. Returns how
        many sets this call prepared: ``close`` stops it at the next chunk of faulting in.
        """
        made = 0
        # Registered for the whole loop, not only for each set: an exit between two sets
        # must stop the next one from starting, not find nothing running and go on.
        with exit_guard.guarded(f"buffer preparation of {nbytes} bytes", stop=self._stop.set):
            while (preparation := self._start_preparation(nbytes, pinned)) is not None:
                made += self._run_preparation(preparation)
        with self._lock:
            pending = [p for p in self._preparing if p.nbytes >= nbytes]
        for preparation in pending:
            preparation.done.wait()
        return made

    def prepare_spares(self, nbytes: int, *, pinned: bool) -> threading.Thread | None:
        """Start ``prepare(nbytes)`` in a background daemon thread, unless one runs or every
        set already fits. Never blocks. Returns the thread started, if any."""
        with self._lock:
            if self._closed or (self._preparer is not None and self._preparer.is_alive()):
                return None
            fitting = sum(_fits(b, nbytes, pinned) for b in self._free) + sum(
                p.nbytes >= nbytes and (p.pinned or not pinned) for p in self._preparing
            )
            leased = self._sets - len(self._free) - len(self._preparing)
            if fitting + leased >= self.max_sets:
                return None
            # Started under the lock, so that ``close`` never sees a thread it cannot join;
            # registered with the exit guard before it starts.
            thread = exit_guard.start_thread(
                lambda: self._prepare_quietly(nbytes, pinned),
                name="actorsys buffer preparation",
                description=f"buffer preparation of {nbytes} bytes", stop=self._stop.set,
            )
            self._preparer = thread
        return thread

    def wait_prepared(self) -> None:
        """Block until the background preparation (if any) is done."""
        with self._lock:
            thread = self._preparer
        if thread is not None:
            thread.join()

    def close(self, timeout: float = 0.0) -> bool:
        """Stop the preparations under way, drop the idle sets, and wait up to ``timeout``
        seconds for the preparations (and the background thread) to end. Returns whether
        they all ended; :meth:`unfinished` names those that did not.

        Blocks the calling thread for that wait only (``timeout=0``: never blocks). Each
        preparation stops within one chunk of faulting in (tens of milliseconds), except a
        pinned set, whose page-locking is one call. Sets still leased are dropped when given
        back. Idempotent.
        """
        with self._lock:
            self._closed = True
            self._stop.set()
            self._sets -= len(self._free)
            self._free.clear()
            self._layouts.clear()
            preparing = list(self._preparing)
            thread = self._preparer
        self.kept.clear()
        deadline = time.monotonic() + timeout
        for preparation in preparing:
            preparation.done.wait(max(0.0, deadline - time.monotonic()))
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not self.unfinished() and (thread is None or not thread.is_alive())

    def unfinished(self) -> list[str]:
        """The preparations still under way, by description (for ``stuck_threads``)."""
        with self._lock:
            return [preparation.description for preparation in self._preparing]

    def statistics(self) -> PoolStatistics:
        kept, kept_nbytes, kept_copied = self.kept.statistics()
        with self._lock:
            return PoolStatistics(
                sets=self._sets,
                free=len(self._free),
                leases=self._leases,
                allocations=self._allocations,
                free_nbytes=sum(b.numel() for b in self._free),
                prepared=self._prepared,
                preparing=len(self._preparing),
                kept=kept,
                kept_nbytes=kept_nbytes,
                kept_copied_nbytes=kept_copied,
            )

    def _start_preparation(self, nbytes: int, pinned: bool) -> Preparation | None:
        with self._lock:
            if self._closed or self._stop.is_set():
                return None
            if self._sets < self.max_sets:
                self._sets += 1
            else:
                unfit = [b for b in self._free if not _fits(b, nbytes, pinned)]
                if not unfit:
                    return None
                dropped = min(unfit, key=lambda b: b.numel())
                self._free.remove(dropped)
                self._drop(dropped)
            preparation = Preparation(nbytes, pinned)
            self._preparing.append(preparation)
            return preparation

    def _run_preparation(self, preparation: Preparation) -> bool:
        """Fault ``preparation``'s set in and hand it on; False if it was stopped first."""
        buffer: torch.Tensor | None = None
        try:
            with exit_guard.guarded(preparation.description, stop=self._stop.set):
                buffer = allocate_faulted(
                    preparation.nbytes, pinned=preparation.pinned, stopped=self._stop.is_set
                )
        finally:
            with self._lock:
                self._preparing.remove(preparation)
                if buffer is not None:
                    self._prepared += 1
                preparation.buffer = buffer
                claimed = preparation.claimed
                if not claimed:
                    if buffer is not None and not self._closed:
                        self._free.append(buffer)
                    else:
                        self._sets -= 1
            preparation.done.set()
        if not claimed and self._on_free is not None:
            self._on_free()
        return buffer is not None

    def _prepare_quietly(self, nbytes: int, pinned: bool) -> None:
        try:
            self.prepare(nbytes, pinned=pinned)
        except Exception:
            log.warning("preparing weight buffers in the background failed", exc_info=True)

    def unclaim(self, preparation: Preparation) -> bool:
        """Hand a claimed preparation back; True if it is still under way (it then joins the
        idle sets when done)."""
        with self._lock:
            if preparation in self._preparing:
                preparation.claimed = False
                return True
            return False

    def note_allocated(self) -> None:
        with self._lock:
            self._allocations += 1

    def take_back(self, buffer: torch.Tensor | None) -> None:
        with self._lock:
            if buffer is not None and not self._closed:
                self._free.append(buffer)
            else:
                self._sets -= 1
                if buffer is not None:
                    self._drop(buffer)
        if self._on_free is not None:
            self._on_free()

    def views_of(
        self,
        buffer: torch.Tensor,
        layout: object,
        lay_out: Callable[[torch.Tensor], dict[str, torch.Tensor]],
    ) -> dict[str, torch.Tensor]:
        """``buffer``'s views for ``layout``: those kept from an earlier point, or made now by
        ``lay_out(buffer)`` and kept while the pool holds the set."""
        with self._lock:
            known = self._layouts.get(id(buffer))
        if known is not None and known[0] is buffer and known[1] is layout:
            return known[2]
        views = lay_out(buffer)
        with self._lock:
            if not self._closed:
                self._layouts[id(buffer)] = (buffer, layout, views)
        return views

    def _drop(self, buffer: torch.Tensor) -> None:
        """Forget the views of a set the pool lets go (called with the lock held), so that
        nothing keeps its memory alive."""
        self._layouts.pop(id(buffer), None)


def _fits(buffer: torch.Tensor, nbytes: int, pinned: bool) -> bool:
    return buffer.numel() >= nbytes and (buffer.is_pinned() or not pinned)

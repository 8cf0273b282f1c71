"""The frozen tensors of a model, copied once and kept across points.

Under adapter training (LoRA) almost every tensor is frozen: copying the base at every point
would cost the trainer a full copy for a few megabytes that changed. The kept base holds one
CPU copy of each frozen tensor, stamped with what identifies its contents without reading
them: storage address, shape, strides, dtype, device and the tensor's version counter
(``tensor._version``, bumped by every in-place operation on it or on a view sharing it,
``optimizer.step``, ``copy_`` and ``load_state_dict`` included). A refresh copies only the
tensors whose stamp changed. A change made through ``tensor.data`` bypasses the version
counter (``.data`` is a new tensor with a counter of its own) and is not seen.

Points still being written read the kept copies, so a copy in use is never overwritten: a
tensor that changed while a holder reads the base gets a new copy (copy-on-write) and the old
one lives until its last holder lets go. One model is kept at a time; refreshing for another
model starts over.

Thread-safe: the trainer's thread (or a preparing thread) refreshes, any thread releases.
Refreshes run one at a time, and the bookkeeping lock is never held during a copy, so a
release (from the trio thread) never waits for one.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping

import torch

Stamp = tuple[int, int, tuple[int, ...], tuple[int, ...], torch.dtype, torch.device]


class KeptBase:
    def __init__(self) -> None:
        self._refresh_lock = threading.Lock()
        self._lock = threading.Lock()
        self._owner: weakref.ref[torch.nn.Module] | None = None
        self._tensors: dict[str, torch.Tensor] = {}
        self._stamps: dict[str, Stamp] = {}
        self._holders = 0
        self._copied_nbytes = 0

    def refresh(
        self, owner: torch.nn.Module, frozen: Mapping[str, torch.Tensor], *, hold: bool
    ) -> tuple[dict[str, torch.Tensor], Callable[[], None]]:
        """Bring the kept copies up to date with ``frozen`` (the owner's frozen tensors).

        Blocks the calling thread for the copies of the tensors that changed since the last
        refresh: all of them the first time. Returns the copies, and a release to call once
        they are no longer read (with ``hold``; without, the copies may be replaced at the
        next refresh and the release does nothing).
        """
        with self._refresh_lock:
            with self._lock:
                if self._owner is None or self._owner() is not owner:
                    self._owner = weakref.ref(owner)
                    self._tensors, self._stamps = {}, {}
                shared = self._holders > 0
            tensors = {name: t for name, t in self._tensors.items() if name in frozen}
            stamps = {name: s for name, s in self._stamps.items() if name in frozen}
            streams: dict[torch.device, torch.cuda.Stream] = {}
            try:
                with torch.no_grad():
                    for name, source in frozen.items():
                        stamp = _stamp(source)
                        if stamps.get(name) == stamp:
                            continue
                        kept = tensors.get(name)
                        if shared or kept is None or not _same_layout(kept, source):
                            kept = _empty_like(source)
                        on_cuda = source.device.type == "cuda"
                        if on_cuda and source.device not in streams:
                            streams[source.device] = torch.cuda.current_stream(source.device)
                        kept.copy_(source, non_blocking=on_cuda)
                        tensors[name], stamps[name] = kept, stamp
                        self._copied_nbytes += kept.numel() * kept.element_size()
            finally:
                for stream in streams.values():
                    stream.synchronize()
            with self._lock:
                self._tensors, self._stamps = tensors, stamps
                if hold:
                    self._holders += 1
        return dict(tensors), self._releaser() if hold else _nothing

    def statistics(self) -> tuple[int, int, int]:
        """(models kept: 0 or 1, bytes kept, bytes copied into the kept base so far)."""
        with self._lock:
            nbytes = sum(t.numel() * t.element_size() for t in self._tensors.values())
            return (1 if self._tensors else 0), nbytes, self._copied_nbytes

    def clear(self) -> None:
        """Forget the kept copies (holders keep theirs alive until they let go)."""
        with self._lock:
            self._owner = None
            self._tensors, self._stamps = {}, {}

    def _releaser(self) -> Callable[[], None]:
        done = threading.Event()

        def release() -> None:
            with self._lock:
                if not done.is_set():
                    done.set()
                    self._holders -= 1

        return release


def _stamp(tensor: torch.Tensor) -> Stamp:
    return (
        tensor.data_ptr(),
        tensor._version,
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
        tensor.device,
    )


def _same_layout(kept: torch.Tensor, source: torch.Tensor) -> bool:
    return kept.shape == source.shape and kept.dtype == source.dtype


def _empty_like(source: torch.Tensor) -> torch.Tensor:
    pin = source.device.type == "cuda" and torch.cuda.is_available()
    return torch.empty(source.shape, dtype=source.dtype, pin_memory=pin)


def _nothing() -> None:
    return None

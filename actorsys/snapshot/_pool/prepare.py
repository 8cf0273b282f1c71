"""Getting ready for the first point ahead of it: plan the weights, learn whether transformers
converts them on save, and fault the pool's buffer sets in, without copying anything.

Without it the first point pays what later points do not: transformers' per-class conversion
table (looked up off the trainer's thread anyway, see ``_conversions``) and page faults on
fresh buffers (after the first copy the pool faults its other sets in the background, see
``_pool``). With it, the first point costs what a later one does.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
from collections.abc import Mapping

import torch
import trio

from actorsys._errors import ConfigError, UnsupportedModelError
from actorsys.runtime import ThreadTracker, exit_guard, run_blocking
from actorsys.snapshot import _conversions
from actorsys.snapshot._pool.pool import BufferPool, PoolStatistics
from actorsys.snapshot._state import Source, StatePlan, plan_state
from actorsys.snapshot._state_plan import aligned

log = logging.getLogger("actorsys.snapshot")


def plan_source(
    model: torch.nn.Module | None, state_dict: Mapping[str, torch.Tensor] | None
) -> StatePlan:
    """Plan exactly one of ``model`` / ``state_dict`` (as ``submit`` will); cheap, in the
    caller's thread. Raises :class:`~actorsys.ConfigError` naming the argument at fault."""
    if (model is None) == (state_dict is None):
        raise ConfigError("prepare", "pass exactly one of model= or state_dict=")
    if model is not None and not isinstance(model, torch.nn.Module):
        raise ConfigError("model", f"expected a torch.nn.Module, got {type(model).__name__}")
    if state_dict is not None and not isinstance(state_dict, Mapping):
        kind = type(state_dict).__name__
        raise ConfigError("state_dict", f"expected a mapping of tensors, got {kind}")
    source: Source = model if model is not None else state_dict  # type: ignore[assignment]
    try:
        return plan_state(source)
    except UnsupportedModelError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError("model" if model is not None else "state_dict", str(exc)) from exc


def prepare_planned(pool: BufferPool, plan: StatePlan) -> PoolStatistics:
    """The blocking half: conversions of the model's class, then every set of ``pool`` made
    large enough for ``plan`` and faulted in, and a peft model's frozen base copied into the
    pool's kept base. Run it in a worker thread."""
    if plan.model is not None:
        _conversions.resolve(plan.model)
    pool.prepare(plan.buffer_nbytes, pinned=plan.on_cuda)
    if plan.adapters is not None:
        pool.kept.refresh(plan.adapters.owner, plan.adapters.frozen, hold=False)
    return pool.statistics()


async def prepare_weights(
    pool: BufferPool,
    tracker: ThreadTracker,
    *,
    model: torch.nn.Module | None = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
) -> PoolStatistics:
    """Plan in the caller's thread, then ``prepare_planned`` in a worker thread.

    Blocks the calling task (not the trio thread) until every set is faulted in. Cancelling
    returns at once; the preparation goes on in its thread and its sets still join the pool.
    """
    plan = plan_source(model, state_dict)
    return await run_blocking(
        lambda: prepare_planned(pool, plan),
        abandon_on_cancel=True,
        limiter=trio.CapacityLimiter(1),
        description="preparing weight buffers",
        tracker=tracker,
    )


_MAX_HEADER_BYTES = 100_000_000


def checkpoint_buffer_nbytes(path: str) -> int | None:
    """Bytes of buffer a copy of the weights stored in ``path``'s safetensors files needs,
    each tensor aligned as a plan aligns it, read from the files' headers alone. None where
    ``path`` holds no safetensors file or a header cannot be read."""
    total, found = 0, False
    try:
        for name in sorted(os.listdir(path)):
            if not name.endswith(".safetensors"):
                continue
            with open(os.path.join(path, name), "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                # A corrupt or crafted length must not allocate: safetensors itself refuses
                # headers over 100 MB, and none can pass the end of its file.
                if size > min(_MAX_HEADER_BYTES, os.fstat(f.fileno()).st_size - 8):
                    raise ValueError(f"{name}: header length {size} is past its file's end")
                header = json.loads(f.read(size))
            for key, info in header.items():
                if key != "__metadata__":
                    start, end = info["data_offsets"]
                    total += aligned(end - start)
            found = True
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        log.info("not preparing buffers from %s: %r", path, exc)
        return None
    return total if found else None


def prepare_like_checkpoint(pool: BufferPool, path: str) -> threading.Thread:
    """Fault ``pool``'s sets in, in a daemon thread, for weights the size of those stored in
    ``path`` (the base checkpoint a trainer starts from), so that the first point copies into
    memory already mapped, with no call from the trainer. Never blocks.

    A guess, never a commitment: weights of another size or dtype only mean a first copy into
    fresh memory, as without it; a set too small is replaced when it is leased. The faulting
    in runs in the pool's own preparation thread, which ``pool.close`` stops.
    """

    def run() -> None:
        nbytes = checkpoint_buffer_nbytes(path)
        if nbytes:
            pool.prepare_spares(nbytes, pinned=False)

    return exit_guard.start_thread(
        run, name="actorsys buffer sizing", description=f"buffer sizing of {path}"
    )

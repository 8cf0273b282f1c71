"""Snapshots: weights captured at submit, written in the background as HF checkpoints.

``capture`` runs in the caller's thread: one copy of the state dict into a CPU buffer set
leased from a :class:`BufferPool` (pinned when the weights live on CUDA). ``write_snapshot``
runs in a worker thread: safetensors shards (+ index), config, generation config and the
non-weight files of ``base_checkpoint``, every file fsync'd. ``CapturedWeights.release``
returns the buffers to the pool, once no writer reads them any more. ``prepare_weights`` gets
the pool ready for given weights ahead of the first point (the supervisor's ``prepare``).
What form a model takes (dense, peft adapters, sharded, or unsupported) is decided in one
place, ``_forms``; a peft LoRA model is written merged (``_adapters``), its frozen base kept
across points beside the pool's sets (``_kept``). A sharded model's ranks each copy their
local shards (``capture_shards`` on the ranks that only contribute them) and write their own
ranges of one set of files (``write_pieces``; see ``_sharded``). A model planned before and
unchanged since reuses its plan (``_plans``).
"""

from actorsys.snapshot._capture import (
    CapturedWeights,
    WeightsReleasedError,
    caller_streams,
    capture,
    capture_shards,
)
from actorsys.snapshot._pool.lease import BufferLease
from actorsys.snapshot._pool.pool import BufferPool, PoolStatistics
from actorsys.snapshot._pool.prepare import prepare_like_checkpoint, prepare_weights
from actorsys.snapshot._sharded.write import write_pieces
from actorsys.snapshot._state import Source, StatePlan, plan_state
from actorsys.snapshot._write.model_files import (
    CONFIG_NAME,
    DEFAULT_MAX_SHARD_SIZE,
    INDEX_NAME,
    NON_WEIGHT_SUFFIXES,
    WEIGHTS_NAME,
    copy_non_weight_files,
    fsync_tree,
)
from actorsys.snapshot._write.write import write_snapshot, write_weights

WEIGHT_FILE = WEIGHTS_NAME


def weights_nbytes(source: Source) -> int:
    """Bytes of tensor data a snapshot of ``source`` writes (tied duplicates counted once)."""
    return plan_state(source).nbytes


__all__ = [
    "CONFIG_NAME",
    "DEFAULT_MAX_SHARD_SIZE",
    "INDEX_NAME",
    "NON_WEIGHT_SUFFIXES",
    "WEIGHTS_NAME",
    "WEIGHT_FILE",
    "BufferLease",
    "BufferPool",
    "CapturedWeights",
    "PoolStatistics",
    "Source",
    "StatePlan",
    "WeightsReleasedError",
    "caller_streams",
    "capture",
    "capture_shards",
    "copy_non_weight_files",
    "fsync_tree",
    "plan_state",
    "prepare_like_checkpoint",
    "prepare_weights",
    "weights_nbytes",
    "write_pieces",
    "write_snapshot",
    "write_weights",
]

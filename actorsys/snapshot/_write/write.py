"""Writing captured weights as a complete Hugging Face checkpoint directory.

The layout is the one ``save_pretrained`` writes: ``model.safetensors``, or shards
``model-0000i-of-0000N.safetensors`` split by huggingface_hub's own splitter plus
``model.safetensors.index.json``; ``config.json`` and ``generation_config.json`` through
transformers' own ``save_pretrained``; tokenizer files, chat template and other non-weight
files copied from ``base_checkpoint``. Every file is fsync'd before the caller publishes.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

import torch
from huggingface_hub import split_state_dict_into_shards_factory

from actorsys.snapshot._capture import CapturedWeights, WeightsReleasedError
from actorsys.snapshot._sharded.write import write_sharded_snapshot
from actorsys.snapshot._state_plan import tensor_nbytes
from actorsys.snapshot._write.model_files import (
    DEFAULT_MAX_SHARD_SIZE,
    INDEX_NAME,
    SHARD_PATTERN,
    _write_text,
    fsync_tree,
    write_model_files,
)
from actorsys.snapshot._write.safetensors import write_file


def write_snapshot(
    weights: CapturedWeights,
    directory: str,
    *,
    base_checkpoint: str | None = None,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
) -> None:
    """Write ``weights`` into ``directory`` (which exists) as a loadable HF checkpoint.

    Blocking (disk I/O, fsync of every file); run it in a worker thread. Safe to abandon: it
    writes only inside ``directory``, and once the weights are released (the point gave up on
    this write) it stops at the next chunk, removes ``directory`` and raises
    ``WeightsReleasedError``. Disk errors (``OSError``: ENOSPC, EACCES, a vanished directory)
    propagate; the caller removes the partial directory.
    """
    try:
        with weights.reading():
            if weights.sharding is not None:
                write_sharded_snapshot(
                    weights, directory, base_checkpoint=base_checkpoint,
                    max_shard_size=max_shard_size,
                )
            else:
                _write(weights, directory, base_checkpoint, max_shard_size)
    except WeightsReleasedError:
        shutil.rmtree(directory, ignore_errors=True)
        raise


def _write(
    weights: CapturedWeights, directory: str, base_checkpoint: str | None, max_shard_size: int
) -> None:
    write_model_files(weights, directory, base_checkpoint)
    weights.finish()
    tensors: Mapping[str, torch.Tensor] = weights.tensors
    converter = weights.resolve_converter()
    if converter is not None:
        tensors = _revert_weight_conversion(converter, tensors)
    write_weights(
        tensors,
        directory,
        max_shard_size=max_shard_size,
        num_parameters=weights.num_parameters,
        check=weights.check_live,
    )
    fsync_tree(directory)


def write_weights(
    tensors: Mapping[str, torch.Tensor],
    directory: str,
    *,
    max_shard_size: int,
    num_parameters: int,
    check: Callable[[], None] | None = None,
) -> list[str]:
    """Write ``tensors`` as safetensors shards of at most ``max_shard_size`` bytes (a larger
    tensor gets a shard of its own), with an index when there is more than one. Returns the
    file names written. ``check()`` runs before every chunk (see ``write_file``)."""
    split = split_state_dict_into_shards_factory(
        dict(tensors),
        get_storage_size=tensor_nbytes,
        filename_pattern=SHARD_PATTERN,
        max_shard_size=max_shard_size,
    )
    live = check if check is not None else _always_live
    for filename, names in split.filename_to_tensors.items():
        write_file(
            os.path.join(directory, filename),
            {name: tensors[name] for name in names},
            metadata={"format": "pt"},
            check=live,
        )
    written = list(split.filename_to_tensors)
    if split.is_sharded:
        index = {
            "metadata": {"total_parameters": num_parameters, **split.metadata},
            "weight_map": split.tensor_to_filename,
        }
        _write_text(
            os.path.join(directory, INDEX_NAME), json.dumps(index, indent=2, sort_keys=True) + "\n"
        )
        written.append(INDEX_NAME)
    return written


def _revert_weight_conversion(
    model: Any, tensors: Mapping[str, torch.Tensor]
) -> Mapping[str, torch.Tensor]:
    from transformers.core_model_loading import revert_weight_conversion

    reverted: Mapping[str, torch.Tensor] = revert_weight_conversion(model, dict(tensors))
    return reverted


def _always_live() -> None:
    return None

"""The files of a Hugging Face checkpoint besides the weights' bytes, as ``save_pretrained``
names them, and writing them durably: the model files besides the weights, the non-weight files
of a base checkpoint copied, a text file written, a tree fsync'd. Shared by the writer of a
plain model (``_write``) and the one of a sharded model (``_sharded``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from typing import Any, Protocol


class ModelConfigs(Protocol):
    """What :func:`write_model_files` reads of a capture (``CapturedWeights`` is one): the
    model's config and generation config, each None when the model has none."""

    @property
    def config(self) -> Any: ...

    @property
    def generation_config(self) -> Any: ...

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
SHARD_PATTERN = "model{suffix}.safetensors"
CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"
DEFAULT_MAX_SHARD_SIZE = 5 * 1000**3
NON_WEIGHT_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".tiktoken", ".py")


def copy_non_weight_files(
    base_checkpoint: str, directory: str, *, skip: Iterable[str] = ()
) -> list[str]:
    """Copy the config, tokenizer, chat template and other non-weight files of
    ``base_checkpoint`` into ``directory`` (fsync'd), except the names in ``skip``."""
    if not os.path.isdir(base_checkpoint):
        raise NotADirectoryError(
            f"base_checkpoint {base_checkpoint} is not a directory; "
            "pass an HF checkpoint directory (config.json, tokenizer files)"
        )
    skipped = set(skip)
    copied = []
    for name in sorted(os.listdir(base_checkpoint)):
        source = os.path.join(base_checkpoint, name)
        if (
            name in skipped
            or name.startswith(".")
            or not name.endswith(NON_WEIGHT_SUFFIXES)
            or name.endswith(".index.json")
            or not os.path.isfile(source)
        ):
            continue
        target = os.path.join(directory, name)
        with open(source, "rb") as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1024 * 1024)
            dst.flush()
            os.fsync(dst.fileno())
        copied.append(name)
    return copied


def fsync_tree(directory: str) -> None:
    """fsync every file and directory under ``directory`` (what ``save_pretrained`` wrote
    without)."""
    for root, _, files in os.walk(directory):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def write_model_files(
    weights: ModelConfigs, directory: str, base_checkpoint: str | None
) -> None:
    """What ``save_pretrained`` writes besides the weights (the config, the generation config,
    the non-weight files of ``base_checkpoint``), for a plain and a sharded model alike."""
    own = {CONFIG_NAME} if weights.config is not None else set()
    if weights.generation_config is not None:
        own.add(GENERATION_CONFIG_NAME)
    if base_checkpoint is not None:
        copy_non_weight_files(base_checkpoint, directory, skip=own)
    if weights.config is not None:
        weights.config.save_pretrained(directory)
    if weights.generation_config is not None:
        weights.generation_config.save_pretrained(directory)

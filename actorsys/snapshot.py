"""Weights captured at submit, and how they are written as a Hugging Face checkpoint."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import save_file

WEIGHT_FILE = "model.safetensors"
NON_WEIGHT_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".tiktoken", ".py")


@dataclass
class CapturedWeights:
    """A CPU copy of the weights of one point, owned by the pipeline until written."""

    tensors: dict[str, torch.Tensor]
    config: dict[str, Any] | None
    nbytes: int


def weights_nbytes(source: torch.nn.Module | Mapping[str, torch.Tensor]) -> int:
    state = source.state_dict() if isinstance(source, torch.nn.Module) else source
    return sum(t.numel() * t.element_size() for t in state.values())


def capture(source: torch.nn.Module | Mapping[str, torch.Tensor]) -> CapturedWeights:
    """Copy ``source``'s tensors to CPU memory the pipeline owns.

    Runs in the caller's thread and blocks it for the copy; afterwards the caller may change
    its weights freely.
    """
    state = source.state_dict() if isinstance(source, torch.nn.Module) else dict(source)
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"state_dict[{name!r}] is a {type(value).__name__}, not a tensor")
    tensors = {name: t.detach().to("cpu", copy=True).contiguous() for name, t in state.items()}
    config = None
    model_config = getattr(source, "config", None)
    if model_config is not None and hasattr(model_config, "to_dict"):
        config = model_config.to_dict()
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    return CapturedWeights(tensors=tensors, config=config, nbytes=nbytes)


def write_snapshot(
    weights: CapturedWeights, directory: str, *, base_checkpoint: str | None
) -> None:
    """Write ``weights`` into ``directory`` (which exists) as a loadable HF checkpoint.

    Blocking (disk I/O, fsync); safe to abandon: it only writes inside ``directory``.
    """
    if base_checkpoint is not None:
        copy_non_weight_files(base_checkpoint, directory)
    if weights.config is not None:
        with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
            json.dump(weights.config, f, indent=2, default=str)
    path = os.path.join(directory, WEIGHT_FILE)
    save_file(weights.tensors, path, metadata={"format": "pt"})
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def copy_non_weight_files(base_checkpoint: str, directory: str) -> None:
    for name in os.listdir(base_checkpoint):
        source = os.path.join(base_checkpoint, name)
        if os.path.isfile(source) and name.endswith(NON_WEIGHT_SUFFIXES) and not name.startswith("."):
            if name.endswith(".index.json"):
                continue
            shutil.copyfile(source, os.path.join(directory, name))

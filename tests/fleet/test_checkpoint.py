"""Checking a checkpoint before an engine loads it: real checkpoints written by transformers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from actorsys.fleet.checkpoint import (
    CheckpointMismatchError,
    check_checkpoint,
    read_config,
    read_tensor_infos,
)
from tests.fleet.conftest import TinyModels, corrupt_copy


def check(path: Path, tiny: TinyModels, *, require_complete: bool = True) -> None:
    check_checkpoint(
        str(path),
        require_complete=require_complete,
        served_config=read_config(str(tiny.base)),
        served_tensors=read_tensor_infos(str(tiny.base)),
    )


def test_a_snapshot_of_the_served_architecture_passes(tiny: TinyModels) -> None:
    check(tiny.step1, tiny)


def test_missing_directory_is_refused(tiny: TinyModels, tmp_path: Path) -> None:
    with pytest.raises(CheckpointMismatchError, match="is not a directory"):
        check(tmp_path / "absent", tiny)


def test_directory_without_marker_is_refused_only_when_required(
    tiny: TinyModels, tmp_path: Path
) -> None:
    path = tmp_path / "incomplete"
    shutil.copytree(tiny.step1, path)
    (path / ".complete").unlink()
    with pytest.raises(CheckpointMismatchError, match="no .complete marker"):
        check(path, tiny)
    check(path, tiny, require_complete=False)


def test_other_architecture_is_refused_naming_the_differing_keys(tiny: TinyModels) -> None:
    with pytest.raises(CheckpointMismatchError, match="hidden_size: 64 != 96"):
        check(tiny.other_arch, tiny)


def test_corrupt_safetensors_header_is_refused(tiny: TinyModels, tmp_path: Path) -> None:
    with pytest.raises(CheckpointMismatchError, match="corrupt header"):
        check(corrupt_copy(tiny.step1, tmp_path / "corrupt"), tiny)


def test_truncated_safetensors_is_refused(tiny: TinyModels, tmp_path: Path) -> None:
    path = tmp_path / "truncated"
    shutil.copytree(tiny.step1, path)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(CheckpointMismatchError, match="truncated or corrupt"):
        check(path, tiny)


def test_same_config_but_other_tensor_shapes_is_refused(tiny: TinyModels, tmp_path: Path) -> None:
    path = tmp_path / "lying_config"
    shutil.copytree(tiny.other_arch, path)
    shutil.copyfile(tiny.base / "config.json", path / "config.json")
    with pytest.raises(CheckpointMismatchError, match="tensor"):
        check(path, tiny)


def test_config_without_architectures_key_still_matches(tiny: TinyModels, tmp_path: Path) -> None:
    path = tmp_path / "built_in_code"
    shutil.copytree(tiny.step1, path)
    config = json.loads((path / "config.json").read_text())
    del config["architectures"]
    (path / "config.json").write_text(json.dumps(config))
    check(path, tiny)

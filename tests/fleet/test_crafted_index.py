"""A checkpoint index whose ``weight_map`` names a file outside the checkpoint (an absolute
path, ``../``) is refused before anything reads it: by the check at pin and by the embedded
engine's load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from actorsys.fleet.checkpoint import CheckpointMismatchError, weight_files
from actorsys.fleet.embedded.model import ModelHost
from tests.fleet.conftest import TinyModels


def crafted(tiny: TinyModels, tmp_path: Path, shard: str) -> Path:
    """A copy of ``tiny.step1`` whose only weights are what its index names: ``shard``."""
    target = tmp_path / "crafted" / "ckpt"
    shutil.copytree(tiny.step1, target)
    (target / "model.safetensors").unlink()
    (target / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {"lm_head.weight": shard}}))
    (target / ".complete").touch()
    return target


@pytest.mark.parametrize("how", ["absolute", "dotdot", "subdir"])
def test_an_index_naming_a_file_outside_the_checkpoint_is_refused(
    tiny: TinyModels, tmp_path: Path, how: str
) -> None:
    outside = tmp_path / "crafted" / "elsewhere.safetensors"
    outside.parent.mkdir(parents=True)
    shutil.copy(tiny.step2 / "model.safetensors", outside)
    shard = {"absolute": str(outside), "dotdot": "../elsewhere.safetensors",
             "subdir": "sub/../../elsewhere.safetensors"}[how]
    target = crafted(tiny, tmp_path, shard)
    with pytest.raises(CheckpointMismatchError, match="not a file of the checkpoint"):
        weight_files(str(target))


def test_the_engine_refuses_to_load_through_a_crafted_index(
    tiny: TinyModels, tmp_path: Path
) -> None:
    outside = tmp_path / "crafted" / "elsewhere.safetensors"
    outside.parent.mkdir(parents=True)
    shutil.copy(tiny.step2 / "model.safetensors", outside)
    target = crafted(tiny, tmp_path, str(outside))
    host = ModelHost(str(tiny.base))
    with pytest.raises(CheckpointMismatchError, match="not a file of the checkpoint"):
        host.load(str(target), "1", require_complete=True)
    assert host.version != "1"

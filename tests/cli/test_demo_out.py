"""``demo --out DIR`` deletes or overwrites only what an earlier demo made in DIR."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actorsys._errors import ConfigError
from actorsys.cli import main
from actorsys.demo.out_dir import MANIFEST, prepare_out


@pytest.mark.parametrize("name", ["base", "staging", "metrics.jsonl", "eval.png"])
def test_demo_refuses_an_out_holding_what_it_did_not_make_and_leaves_it_alone(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    mine = out / name
    if "." in name:
        out.mkdir()
        mine.write_text("my own file")
    else:
        mine.mkdir(parents=True)
        (mine / "notes.txt").write_text("my own file")
    assert main(["demo", "--steps", "1", "--every", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("actorsys demo: argument --out: ")
    assert str(mine) in err
    kept = mine if mine.is_file() else mine / "notes.txt"
    assert kept.read_text() == "my own file"
    assert not (out / MANIFEST).exists()


def test_an_earlier_demos_files_are_replaced_and_the_rest_of_out_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare_out(str(out))
    (out / "base").mkdir()
    (out / "base" / "model.safetensors").write_bytes(b"old")
    (out / "staging" / "step_5").mkdir(parents=True)
    (out / "metrics.jsonl").write_text("{}\n")
    (out / "mine.txt").write_text("kept")
    prepare_out(str(out))
    assert not (out / "base").exists() and not (out / "staging").exists()
    assert not (out / "metrics.jsonl").exists()
    assert (out / "mine.txt").read_text() == "kept"
    assert "base" in json.loads((out / MANIFEST).read_text())["paths"]


def test_demo_out_that_is_a_file_or_cannot_be_created_is_refused(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("mine")
    with pytest.raises(ConfigError, match="is not a directory"):
        prepare_out(str(afile))
    assert afile.read_text() == "mine"
    with pytest.raises(ConfigError, match="cannot write into /proc/x"):
        prepare_out("/proc/x")

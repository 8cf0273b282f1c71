"""A snapshot's tokenizer files must lie in it: a ``chat_template.jinja`` (or any tokenizer
file) that is a link leading outside the snapshot is refused, naming the file, where a
snapshot's tokenizer is read: the CPU engine refuses to load the snapshot (or to start on
it), and the trainer's evaluation skips the point, its secret text read nowhere. Links inside
the snapshot stay fine. Real snapshot directories with real symlinks, and the real CPU engine
process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from actorsys.contracts import EvalSkip
from actorsys.evals import EvalDataset
from actorsys.evals.data.prompts import prepare_prompts
from actorsys.fleet.chat_template import load_tokenizer
from actorsys.fleet.checkpoint import CheckpointMismatchError, check_checkpoint, read_config
from tests.chat_models import make_chat_model
from tests.engine_process import engine_process
from tests.fleet.conftest import TinyModels

SECRET = "{{ 'the secret key is hunter2' }}"


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_chat_model(tmp_path_factory.mktemp("chat") / "model", seed=3)


def linked(source: Path, root: Path, name: str, *, inside: bool) -> Path:
    """A copy of snapshot ``source`` whose ``name`` is a link: to a file outside the copy
    holding :data:`SECRET`, or (``inside``) to its own content moved into ``moved/``."""
    path = root / "step_1"
    shutil.copytree(source, path)
    target = path / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if inside:
        (path / "moved").mkdir()
        moved = path / "moved" / target.name
        shutil.move(target, moved)
        target.symlink_to(Path("..") / "moved" / target.name if target.parent != path
                          else Path("moved") / target.name)
    else:
        secret = root / "secret.jinja"
        secret.write_text(SECRET)
        target.unlink(missing_ok=True)
        target.symlink_to(secret)
    return path


@pytest.mark.parametrize(
    "name", ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json",
             "additional_chat_templates/tool_use.jinja"],
)
def test_a_tokenizer_file_linking_outside_the_snapshot_is_refused_naming_it(
    chat_model: Path, tmp_path: Path, name: str
) -> None:
    path = linked(chat_model, tmp_path, name, inside=False)
    served = read_config(str(chat_model))
    with pytest.raises(CheckpointMismatchError, match=f"'{name}' is a link leading outside"):
        check_checkpoint(str(path), require_complete=True, served_config=served)
    with pytest.raises(CheckpointMismatchError, match=f"'{name}' is a link leading outside"):
        load_tokenizer(str(path))


def test_a_template_directory_linking_outside_is_refused(chat_model: Path, tmp_path: Path) -> None:
    path = tmp_path / "step_1"
    shutil.copytree(chat_model, path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "tool_use.jinja").write_text(SECRET)
    (path / "additional_chat_templates").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CheckpointMismatchError, match="'additional_chat_templates' is a link"):
        load_tokenizer(str(path))


def test_links_inside_the_snapshot_and_to_outside_weights_stay_fine(
    chat_model: Path, tmp_path: Path
) -> None:
    path = linked(chat_model, tmp_path, "chat_template.jinja", inside=True)
    (tmp_path / "store").mkdir()
    shutil.move(path / "model.safetensors", tmp_path / "store" / "model.safetensors")
    (path / "model.safetensors").symlink_to(tmp_path / "store" / "model.safetensors")
    check_checkpoint(str(path), require_complete=True, served_config=read_config(str(chat_model)))
    own = load_tokenizer(str(chat_model)).chat_template
    assert load_tokenizer(str(path)).chat_template == own


def test_the_trainers_evaluation_skips_a_snapshot_whose_template_links_outside(
    chat_model: Path, tmp_path: Path
) -> None:
    path = linked(chat_model, tmp_path, "chat_template.jinja", inside=False)
    dataset = EvalDataset(name="chat", records=({"prompt": "hi", "label": "x"},),
                          apply_chat_template=True)
    with pytest.raises(EvalSkip) as skipped:
        prepare_prompts(str(path), [dataset])
    assert skipped.value.reason == "no_chat_template"
    assert "'chat_template.jinja' is a link leading outside the snapshot" in str(skipped.value)
    assert "hunter2" not in str(skipped.value)
    inside = linked(chat_model, tmp_path / "in", "chat_template.jinja", inside=True)
    [prompts] = prepare_prompts(str(inside), [dataset])
    assert "hunter2" not in prompts.shown[0] and "hi" in prompts.shown[0]


@pytest.mark.timeout(300)
def test_the_cpu_engine_refuses_to_load_a_snapshot_whose_tokenizer_links_outside(
    tiny: TinyModels, tmp_path: Path
) -> None:
    outside = linked(tiny.step1, tmp_path / "out", "tokenizer.json", inside=False)
    inside = linked(tiny.step1, tmp_path / "in", "tokenizer.json", inside=True)
    with engine_process(["--model", str(tiny.base)]) as url, httpx.Client(timeout=60.0) as client:
        refused = client.post(f"{url}/update_weights_from_disk",
                              json={"model_path": str(outside), "weight_version": "out"})
        assert refused.status_code == 400
        assert "'tokenizer.json' is a link leading outside the snapshot" in refused.json()["message"]
        assert client.get(f"{url}/get_weight_version").json()["weight_version"] == "default"
        loaded = client.post(f"{url}/update_weights_from_disk",
                             json={"model_path": str(inside), "weight_version": "in"})
        assert loaded.status_code == 200, loaded.text
        assert client.get(f"{url}/get_weight_version").json()["weight_version"] == "in"


@pytest.mark.timeout(300)
def test_the_cpu_engine_refuses_to_start_on_a_model_whose_template_links_outside(
    chat_model: Path, tmp_path: Path
) -> None:
    path = linked(chat_model, tmp_path, "chat_template.jinja", inside=False)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("ACTORSYS_API_KEY", None)
    started = subprocess.run(
        [sys.executable, "-m", "actorsys", "engine", "--model", str(path), "--port", "0"],
        env=env, capture_output=True, timeout=240, check=False)
    stderr = started.stderr.decode()
    assert started.returncode == 1, stderr[-2000:]
    assert "'chat_template.jinja' is a link leading outside the snapshot" in stderr
    assert "Traceback" not in stderr and "hunter2" not in stderr

"""Submit: every source kind, and misuse that raises and changes nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import trio

from actorsys import (
    ActorsysError,
    ConfigError,
    DuplicateStepError,
    EvalConfig,
    EvalSupervisor,
    MemorySink,
    SubmitError,
    SupervisorClosedError,
)
from actorsys.staging import COMPLETE
from tests.conftest import snapshot_dirs
from tests.fakes import RecordingEval, tiny_state_dict


async def test_state_dict_is_copied_before_submit_returns(staging: Path, sink: MemorySink) -> None:
    weights = tiny_state_dict()
    expected = {k: v.clone() for k, v in weights.items()}
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=RecordingEval(), sink=sink) as sup:
        assert await sup.submit(1, state_dict=weights)
        for tensor in weights.values():
            tensor.add_(100.0)
        await sup.drain()
    from safetensors.torch import load_file

    saved = load_file(os.path.join(staging, "step_1", "model.safetensors"))
    assert saved.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(saved[name], tensor)
    assert sink.by_step()[1].status == "ok"


async def test_model_source_writes_its_weights(staging: Path, sink: MemorySink) -> None:
    model = torch.nn.Linear(3, 2)
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=RecordingEval(), sink=sink) as sup:
        await sup.submit(0, model=model)
    outcome = sink.by_step()[0]
    assert outcome.ok and outcome.snapshot == os.path.join(staging, "step_0")
    assert "model.safetensors" in outcome.data["files"] and COMPLETE in outcome.data["files"]


async def test_delegated_export_writes_into_the_tmp_dir_we_own(staging: Path, sink: MemorySink) -> None:
    seen: list[tuple[int, str]] = []

    async def export(step: int, path: str) -> None:
        seen.append((step, path))
        Path(path, "model.safetensors").write_bytes(b"weights")

    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=RecordingEval(), sink=sink) as sup:
        await sup.submit(3, export=export)
    assert seen[0][0] == 3 and os.path.basename(seen[0][1]).startswith(".tmp-step_3")
    assert sink.by_step()[3].ok
    assert snapshot_dirs(staging) == ["step_3"]


async def test_checkpoint_dir_is_a_baseline_never_deleted(tmp_path: Path, sink: MemorySink) -> None:
    baseline = tmp_path / "baseline"
    baseline.mkdir()
    (baseline / "model.safetensors").write_bytes(b"x")
    config = EvalConfig(keep_snapshots=0)
    async with EvalSupervisor.open(config, eval_fn=RecordingEval(), sink=sink) as sup:
        await sup.submit(0, checkpoint_dir=baseline)
    assert sink.by_step()[0].ok
    assert (baseline / "model.safetensors").exists()


async def test_reuse_mode_evaluates_the_trainers_checkpoint_and_keeps_it(
    tmp_path: Path, sink: MemorySink
) -> None:
    saved = tmp_path / "hf" / "5"
    saved.mkdir(parents=True)
    (saved / "model.safetensors").write_bytes(b"x")
    (saved / COMPLETE).write_bytes(b"")
    eval_fn = RecordingEval()
    config = EvalConfig(save_hf=str(tmp_path / "hf" / "{step}"), keep_snapshots=0)
    async with EvalSupervisor.open(config, eval_fn=eval_fn, sink=sink) as sup:
        await sup.submit(5)
        await sup.submit(6)
    assert sink.by_step()[5].ok and eval_fn.seen[0][1] == str(saved)
    assert sink.by_step()[6].reason == "ckpt_missing"
    assert saved.exists()


async def test_reuse_mode_requires_the_completion_marker(tmp_path: Path, sink: MemorySink) -> None:
    saved = tmp_path / "hf" / "5"
    saved.mkdir(parents=True)
    config = EvalConfig(save_hf=str(tmp_path / "hf" / "{step}"))
    async with EvalSupervisor.open(config, eval_fn=RecordingEval(), sink=sink) as sup:
        await sup.submit(5)
    outcome = sink.by_step()[5]
    assert outcome.reason == "ckpt_missing" and COMPLETE in outcome.data["error"]


async def test_checkpoint_dir_can_require_the_marker(tmp_path: Path, sink: MemorySink) -> None:
    async with EvalSupervisor.open(EvalConfig(), eval_fn=RecordingEval(), sink=sink) as sup:
        await sup.submit(1, checkpoint_dir=tmp_path, require_marker=True)
        await sup.submit(2, checkpoint_dir=tmp_path / "missing")
    assert sink.by_step()[1].reason == "ckpt_missing"
    assert sink.by_step()[2].reason == "ckpt_missing"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "no source"),
        ({"model": torch.nn.Linear(1, 1), "state_dict": {}}, "exactly one source"),
        ({"state_dict": {}, "checkpoint_dir": "/x"}, "exactly one source"),
        ({"model": "not a module"}, "torch.nn.Module"),
        ({"state_dict": [1, 2]}, "mapping"),
        ({"export": 3}, "async callable"),
        ({"state_dict": {}, "require_marker": True}, "require_marker"),
        ({"state_dict": {}, "force": "yes"}, "force"),
    ],
)
async def test_malformed_submit_raises_and_changes_nothing(
    staging: Path, sink: MemorySink, kwargs: dict[str, object], message: str
) -> None:
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=RecordingEval(), sink=sink) as sup:
        with pytest.raises(SubmitError, match=message):
            await sup.submit(1, **kwargs)  # type: ignore[arg-type]
        assert sup.statistics().in_flight == 0
        assert await sup.submit(1, state_dict=tiny_state_dict())
    assert [o.step for o in sink.outcomes] == [1]


@pytest.mark.parametrize("step", [-1, 1.5, True, "3"])
async def test_step_must_be_a_non_negative_integer(staging: Path, step: object) -> None:
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=RecordingEval()) as sup:
        with pytest.raises(SubmitError, match=">= 0"):
            await sup.submit(step, state_dict=tiny_state_dict())  # type: ignore[arg-type]


async def test_repeated_step_is_rejected(staging: Path, sink: MemorySink) -> None:
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=RecordingEval(), sink=sink) as sup:
        await sup.submit(4, state_dict=tiny_state_dict())
        with pytest.raises(DuplicateStepError):
            await sup.submit(4, state_dict=tiny_state_dict())
    assert [o.step for o in sink.outcomes] == [4]


async def test_exporting_source_needs_a_staging_dir() -> None:
    async with EvalSupervisor.open(EvalConfig(), eval_fn=RecordingEval()) as sup:
        with pytest.raises(SubmitError, match="hf_dir"):
            await sup.submit(1, state_dict=tiny_state_dict())


async def test_submit_after_close_raises_closed(staging: Path) -> None:
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=RecordingEval()) as sup:
        await sup.aclose()
        with pytest.raises(SupervisorClosedError):
            await sup.submit(1, state_dict=tiny_state_dict())
    with pytest.raises(SupervisorClosedError):
        await sup.submit(2, state_dict=tiny_state_dict())


async def test_staging_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("")
    with pytest.raises(ConfigError, match="not a directory") as caught:
        async with EvalSupervisor.open(EvalConfig(hf_dir=path), eval_fn=RecordingEval()):
            pass
    assert caught.value.field == "hf_dir"


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to read-only directories")
async def test_staging_dir_that_is_not_writable_is_refused(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match="not writable"):
            async with EvalSupervisor.open(EvalConfig(hf_dir=tmp_path / "x"), eval_fn=RecordingEval()):
                pass
    finally:
        tmp_path.chmod(0o700)


async def test_staging_dir_on_a_read_only_filesystem_is_refused() -> None:
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs /proc")
    with pytest.raises(ConfigError, match="not writable"):
        async with EvalSupervisor.open(EvalConfig(hf_dir="/proc/self/actorsys"), eval_fn=RecordingEval()):
            pass


class NotAnEval:
    pass


class SyncTrioEval(RecordingEval):
    def evaluate_checkpoint(self, checkpoint_dir, input):  # type: ignore[no-untyped-def, override]
        return None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"eval_fn": NotAnEval()}, "eval_fn"),
        ({"eval_fn": SyncTrioEval()}, "eval_fn.evaluate_checkpoint"),
        ({"eval_fn": RecordingEval(), "fleet": []}, "fleet"),
        ({"eval_fn": RecordingEval(), "fleet": "http://x"}, "fleet"),
        ({"eval_fn": RecordingEval(), "sink": object()}, "sink"),
    ],
)
def test_bad_collaborators_are_refused_at_open(kwargs: dict[str, object], field: str) -> None:
    async def main() -> None:
        async with EvalSupervisor.open(EvalConfig(), **kwargs):  # type: ignore[arg-type]
            pass

    with pytest.raises(ConfigError) as caught:
        trio.run(main)
    assert caught.value.field == field and isinstance(caught.value, ActorsysError)


async def test_errors_raised_in_the_body_reach_the_caller_unwrapped(staging: Path) -> None:
    with pytest.raises(KeyError, match="mine"):
        async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=RecordingEval()):
            raise KeyError("mine")

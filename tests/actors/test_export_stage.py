"""Exporter: tmp dir, marker, atomic rename; failures and timeouts leave nothing behind;
the start-up sweep removes only what an earlier run of ours left."""

from __future__ import annotations

import os
from pathlib import Path

import trio
import trio.lowlevel
import trio.testing

from actorsys import EvalConfig, EvalSupervisor, MemorySink
from actorsys.staging import COMPLETE, MARKER
from tests.conftest import snapshot_dirs, tmp_dirs
from tests.fakes import RecordingEval, tiny_state_dict


async def test_export_is_published_complete_under_step_name(staging: Path, sink: MemorySink) -> None:
    eval_fn = RecordingEval()
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=eval_fn, sink=sink) as sup:
        await sup.submit(7, state_dict=tiny_state_dict())
    step_dir = staging / "step_7"
    assert (step_dir / COMPLETE).exists() and (step_dir / "model.safetensors").exists()
    assert eval_fn.seen == [(7, str(step_dir), "7")]
    assert tmp_dirs(staging) == []


async def test_eval_never_sees_a_half_written_snapshot(staging: Path, sink: MemorySink) -> None:
    in_progress: list[list[str]] = []

    async def export(step: int, path: str) -> None:
        Path(path, "model.safetensors").write_bytes(b"w")
        in_progress.append(snapshot_dirs(staging))
        await trio.lowlevel.checkpoint()

    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=RecordingEval(), sink=sink) as sup:
        await sup.submit(1, export=export)
    assert in_progress == [[]]
    assert sink.by_step()[1].ok


async def test_failed_export_settles_export_failed_and_removes_the_partial_dir(
    staging: Path, sink: MemorySink
) -> None:
    async def export(step: int, path: str) -> None:
        Path(path, "model-00001.safetensors").write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=RecordingEval(), sink=sink) as sup:
        await sup.submit(1, export=export)
        await sup.submit(2, state_dict=tiny_state_dict())
    first = sink.by_step()[1]
    assert first.reason == "export_failed" and "No space left" in first.data["error"]
    assert sink.by_step()[2].ok
    assert tmp_dirs(staging) == [] and snapshot_dirs(staging) == ["step_2"]


async def test_delegated_export_without_weights_is_export_failed(staging: Path, sink: MemorySink) -> None:
    async def export(step: int, path: str) -> None:
        Path(path, "config.json").write_text("{}")

    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=RecordingEval(), sink=sink) as sup:
        await sup.submit(1, export=export)
    outcome = sink.by_step()[1]
    assert outcome.reason == "export_failed" and "no weight files" in outcome.data["error"]
    assert os.listdir(staging) == ["journal.jsonl"]


async def test_export_timeout_settles_and_removes_the_partial_dir(
    staging: Path, sink: MemorySink, autojump_clock: trio.testing.MockClock
) -> None:
    async def export(step: int, path: str) -> None:
        Path(path, "model.safetensors").write_bytes(b"partial")
        await trio.sleep_forever()

    config = EvalConfig(hf_dir=staging, export_timeout=30)
    async with EvalSupervisor.open(config, eval_fn=RecordingEval(), sink=sink) as sup:
        await sup.submit(1, export=export)
        report = await sup.drain(timeout=1000)
        assert trio.current_time() == 30 and report.settled == [1]
        # drain returned once the point's leftovers were gone, not only once it settled
        assert tmp_dirs(staging) == [] and snapshot_dirs(staging) == []
    outcome = sink.by_step()[1]
    assert outcome.reason == "export_timeout"
    assert outcome.metrics["eval/export_time_seconds"] == 30
    assert os.listdir(staging) == ["journal.jsonl"]


async def test_restarted_run_replaces_its_own_stale_snapshot(staging: Path, sink: MemorySink) -> None:
    stale = staging / "step_3"
    stale.mkdir()
    (stale / MARKER).write_bytes(b"")
    (stale / "model.safetensors").write_bytes(b"old")
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=RecordingEval(), sink=sink) as sup:
        await sup.submit(3, state_dict=tiny_state_dict())
    assert sink.by_step()[3].ok
    assert (stale / "model.safetensors").read_bytes() != b"old"
    assert tmp_dirs(staging) == []


async def test_a_step_dir_we_did_not_create_is_never_overwritten(staging: Path, sink: MemorySink) -> None:
    theirs = staging / "step_3"
    theirs.mkdir()
    (theirs / "model.safetensors").write_bytes(b"theirs")
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=RecordingEval(), sink=sink) as sup:
        await sup.submit(3, state_dict=tiny_state_dict())
    outcome = sink.by_step()[3]
    assert outcome.reason == "export_failed" and "not created by actorsys" in outcome.data["error"]
    assert (theirs / "model.safetensors").read_bytes() == b"theirs"
    assert tmp_dirs(staging) == []


async def test_start_sweeps_only_our_tmp_dirs_never_following_symlinks(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    ours = staging / ".tmp-step_1-abc"
    ours.mkdir()
    (ours / MARKER).write_bytes(b"")
    (ours / "model.safetensors").write_bytes(b"partial")
    unmarked = staging / ".tmp-step_2-def"
    unmarked.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / MARKER).write_bytes(b"")
    (outside / "precious").write_bytes(b"keep")
    (staging / ".tmp-step_3-link").symlink_to(outside)
    published = staging / "step_4"
    published.mkdir()
    (published / MARKER).write_bytes(b"")

    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=RecordingEval()):
        pass

    assert not ours.exists()
    assert unmarked.exists() and published.exists()
    assert (outside / "precious").read_bytes() == b"keep"
    assert (staging / ".tmp-step_3-link").is_symlink()


async def test_base_checkpoint_files_are_copied_into_every_export(tmp_path: Path, sink: MemorySink) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text('{"model_type": "llama"}')
    (base / "tokenizer.json").write_text("{}")
    (base / "model.safetensors").write_bytes(b"base weights")
    config = EvalConfig(hf_dir=tmp_path / "staging", base_checkpoint=base)
    async with EvalSupervisor.open(config, eval_fn=RecordingEval(), sink=sink) as sup:
        await sup.submit(1, state_dict=tiny_state_dict())
    files = sink.by_step()[1].data["files"]
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= set(files)
    assert (tmp_path / "staging" / "step_1" / "model.safetensors").read_bytes() != b"base weights"

"""Exports end to end: EvalSupervisor writes real models to disk, and disk failures skip points."""

from __future__ import annotations

import errno
import os
import shutil
import threading
from typing import Any

import pytest
import torch
import trio
import trio.testing

from actorsys import (
    CheckpointEvalFn,
    EvalConfig,
    EvalSupervisor,
    MemorySink,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
    SubmitError,
    staging,
)
from actorsys._core import supervisor
from actorsys._core.staging_claim import LOCK_NAME
from actorsys.actors import exporter
from actorsys.snapshot import capture
from actorsys.snapshot._write import write as _write
from actorsys.supervisor import SubmitRequest

from .snapshot_models import (
    fill_disk,
    input_ids,
    load,
    logits,
    make_base_checkpoint,
    tiny_llama,
    tmpfs,
)


class LoadAndScore(CheckpointEvalFn):
    """Loads the snapshot with transformers (in a worker thread) and returns its logits."""

    runtime = "thread"

    def __init__(self) -> None:
        self.ids = input_ids()

    def evaluate_checkpoint(
        self, checkpoint_dir: str, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        scored = logits(load(checkpoint_dir), self.ids)
        return RolloutFnEvalOutput(data={"logits": scored, "files": os.listdir(checkpoint_dir)})


class ListFiles(CheckpointEvalFn):
    async def evaluate_checkpoint(
        self, checkpoint_dir: str, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        return RolloutFnEvalOutput(data={"files": sorted(os.listdir(checkpoint_dir))})


def train_step(model: torch.nn.Module, ids: torch.Tensor) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = model(ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def state_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in model.state_dict().items()}


def same_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(t, state[name]) for name, t in model.state_dict().items())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
async def test_snapshot_holds_the_weights_of_submit_time_although_training_goes_on(tmp_path, dtype):
    model = tiny_llama(dtype=dtype, tied=True)
    ids = input_ids()
    sink = MemorySink()
    expected = {}

    async with EvalSupervisor.open(
        EvalConfig(hf_dir=tmp_path / "hf"), eval_fn=LoadAndScore(), sink=sink
    ) as sup:
        for step in (10, 20):
            expected[step] = logits(model, ids)
            assert await sup.submit(step, model=model)
            train_step(model, ids)
        report = await sup.drain()

    assert report.pending == []
    assert not torch.equal(expected[10], expected[20])
    for step in (10, 20):
        outcome = sink.by_step()[step]
        assert outcome.ok, outcome
        assert outcome.data["logits"].dtype == dtype
        assert torch.equal(outcome.data["logits"], expected[step])


@pytest.mark.timeout(60)
async def test_sharded_export_loads_with_identical_logits(tmp_path):
    model = tiny_llama(dtype=torch.bfloat16, tied=False)
    sink = MemorySink()

    config = EvalConfig(hf_dir=tmp_path / "hf", max_shard_size=100_000)
    async with EvalSupervisor.open(config, eval_fn=LoadAndScore(), sink=sink) as sup:
        await sup.submit(1, model=model)
        await sup.drain()

    outcome = sink.by_step()[1]
    assert outcome.ok, outcome
    assert "model.safetensors.index.json" in outcome.data["files"]
    assert "model-00001-of-00003.safetensors" in outcome.data["files"]
    assert torch.equal(outcome.data["logits"], logits(model, input_ids()))


@pytest.mark.timeout(60)
async def test_state_dict_export_takes_config_and_tokenizer_from_base_checkpoint(tmp_path):
    model = tiny_llama()
    base = make_base_checkpoint(str(tmp_path / "base"), model)
    sink = MemorySink()

    config = EvalConfig(hf_dir=tmp_path / "hf", base_checkpoint=base)
    async with EvalSupervisor.open(config, eval_fn=LoadAndScore(), sink=sink) as sup:
        await sup.submit(1, state_dict=model.state_dict())
        await sup.drain()

    outcome = sink.by_step()[1]
    assert outcome.ok, outcome
    assert {"tokenizer.json", "chat_template.jinja", "generation_config.json"} <= set(
        outcome.data["files"]
    )
    assert torch.equal(outcome.data["logits"], logits(model, input_ids()))


@pytest.mark.timeout(60)
async def test_disk_full_during_the_write_settles_export_failed_and_leaves_nothing(tmp_path):
    with tmpfs(str(tmp_path / "fs"), "72m") as fs:
        if fs is None:
            pytest.skip("no tmpfs can be mounted here; the simulated ENOSPC test covers this")
        model = tiny_llama()
        before = state_copy(model)
        hf, filler = os.path.join(fs, "hf"), os.path.join(fs, "filler")
        sink = MemorySink()
        async with EvalSupervisor.open(
            EvalConfig(hf_dir=hf), eval_fn=ListFiles(), sink=sink
        ) as sup:
            assert await sup.submit(1, model=model)
            fill_disk(filler, leave=64 * 1024)
            await sup.drain()
            failed = sink.by_step()[1]
            os.remove(filler)
            assert await sup.submit(2, model=model)
            await sup.drain()
            listing = sorted(name for name in os.listdir(hf) if name != LOCK_NAME)

        assert failed.reason == "export_failed"
        assert "No space left on device" in failed.data["error"]
        assert sink.by_step()[2].ok
        assert listing == ["journal.jsonl", "step_2"]
        assert same_state(model, before)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES], ids=["ENOSPC", "EACCES"])
async def test_os_errors_during_the_write_settle_export_failed_and_leave_nothing(
    tmp_path, monkeypatch, code
):
    def half_written(path: str, tensors: Any, **kwargs: Any) -> None:
        with open(path, "wb") as f:
            f.write(b"partial shard")
        raise OSError(code, os.strerror(code), path)

    monkeypatch.setattr(_write, "write_file", half_written)
    model = tiny_llama()
    before = state_copy(model)
    sink = MemorySink()

    async with EvalSupervisor.open(
        EvalConfig(hf_dir=tmp_path / "hf"), eval_fn=ListFiles(), sink=sink
    ) as sup:
        assert await sup.submit(1, model=model)
        await sup.drain()
        restarts = sup.statistics().restarts

    outcome = sink.by_step()[1]
    assert outcome.reason == "export_failed"
    assert os.strerror(code) in outcome.data["error"]
    assert os.listdir(tmp_path / "hf") == ["journal.jsonl"]
    assert restarts == 0
    assert same_state(model, before)


@pytest.mark.timeout(60)
async def test_vanished_staging_dir_settles_export_failed_without_crashing(tmp_path):
    sink = MemorySink()
    async with EvalSupervisor.open(
        EvalConfig(hf_dir=tmp_path / "hf"), eval_fn=ListFiles(), sink=sink
    ) as sup:
        assert await sup.submit(1, model=tiny_llama())
        shutil.rmtree(tmp_path / "hf")
        await sup.drain()
        restarts = sup.statistics().restarts

    outcome = sink.by_step()[1]
    assert outcome.reason == "export_failed"
    assert "No such file or directory" in outcome.data["error"]
    assert restarts == 0


@pytest.mark.timeout(60)
async def test_tmp_dir_removed_during_the_write_settles_export_failed(tmp_path, monkeypatch):
    write_file = _write.write_file

    def removed_underneath(path: str, tensors: Any, **kwargs: Any) -> None:
        shutil.rmtree(os.path.dirname(path))
        write_file(path, tensors, **kwargs)

    monkeypatch.setattr(_write, "write_file", removed_underneath)
    sink = MemorySink()
    async with EvalSupervisor.open(
        EvalConfig(hf_dir=tmp_path / "hf"), eval_fn=ListFiles(), sink=sink
    ) as sup:
        await sup.submit(1, model=tiny_llama())
        await sup.drain()

    outcome = sink.by_step()[1]
    assert outcome.reason == "export_failed"
    assert "No such file or directory" in outcome.data["error"]
    assert os.listdir(tmp_path / "hf") == ["journal.jsonl"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("disk", ["tmpfs", "reported-full"])
async def test_disk_budget_skips_the_point_without_copying(tmp_path, monkeypatch, disk):
    copies = []
    real_capture = supervisor.capture

    def counting_capture(*args: Any, **kwargs: Any) -> Any:
        copies.append(args)
        return real_capture(*args, **kwargs)

    monkeypatch.setattr(supervisor, "capture", counting_capture)
    with tmpfs(str(tmp_path / "fs"), "16m") as fs:
        if disk == "tmpfs":
            if fs is None:
                pytest.skip("no tmpfs can be mounted here")
            hf = os.path.join(fs, "hf")
        else:
            hf = str(tmp_path / "hf")
            monkeypatch.setattr(staging, "free_bytes", lambda path: 10 * 1024 * 1024)
        sink = MemorySink()
        async with EvalSupervisor.open(
            EvalConfig(hf_dir=hf), eval_fn=ListFiles(), sink=sink
        ) as sup:
            admitted = await sup.submit(1, model=tiny_llama())
            await sup.drain()
        listing = os.listdir(hf)

    assert admitted is False
    assert sink.by_step()[1].reason == "disk_budget"
    assert copies == []
    assert listing == ["journal.jsonl"]


@pytest.mark.timeout(60)
async def test_delegated_export_that_writes_no_weights_settles_export_failed(tmp_path):
    async def config_only(step: int, path: str) -> None:
        tiny_llama().config.save_pretrained(path)

    sink = MemorySink()
    async with EvalSupervisor.open(
        EvalConfig(hf_dir=tmp_path / "hf"), eval_fn=ListFiles(), sink=sink
    ) as sup:
        await sup.submit(1, export=config_only)
        await sup.drain()

    outcome = sink.by_step()[1]
    assert outcome.reason == "export_failed"
    assert "wrote no weight files" in outcome.data["error"]
    assert os.listdir(tmp_path / "hf") == ["journal.jsonl"]


@pytest.mark.timeout(60)
async def test_delegated_export_is_published_by_the_exporter(tmp_path):
    model = tiny_llama()

    async def save(step: int, path: str) -> None:
        await trio.to_thread.run_sync(model.save_pretrained, path)

    sink = MemorySink()
    async with EvalSupervisor.open(
        EvalConfig(hf_dir=tmp_path / "hf"), eval_fn=LoadAndScore(), sink=sink
    ) as sup:
        await sup.submit(1, export=save)
        await sup.drain()

    outcome = sink.by_step()[1]
    assert outcome.ok, outcome
    assert ".complete" in outcome.data["files"]
    assert torch.equal(outcome.data["logits"], logits(model, input_ids()))


@pytest.mark.timeout(60)
async def test_points_reuse_the_same_buffers(tmp_path, monkeypatch):
    pointers = set()
    real_capture = supervisor.capture

    def recording_capture(*args: Any, **kwargs: Any) -> Any:
        weights = real_capture(*args, **kwargs)
        pointers.add(next(iter(weights.tensors.values())).data_ptr())
        return weights

    monkeypatch.setattr(supervisor, "capture", recording_capture)
    model, ids = tiny_llama(), input_ids()
    sink = MemorySink()
    async with EvalSupervisor.open(
        EvalConfig(hf_dir=tmp_path / "hf", max_in_flight=1), eval_fn=ListFiles(), sink=sink
    ) as sup:
        for step in range(4):
            await sup.submit(step, model=model)
            train_step(model, ids)
        await sup.drain()

    assert [o.ok for o in sink.outcomes] == [True] * 4
    assert len(pointers) == 1


@pytest.mark.timeout(60)
async def test_a_host_thread_copies_into_the_reserved_buffers(tmp_path):
    model = tiny_llama()
    sink = MemorySink()
    async with EvalSupervisor.open(
        EvalConfig(hf_dir=tmp_path / "hf"), eval_fn=LoadAndScore(), sink=sink
    ) as sup:
        reservation = await sup.reserve(SubmitRequest(1, model=model))
        assert reservation is not None
        assert reservation.buffers is not None
        weights = await trio.to_thread.run_sync(
            lambda: capture(model, buffers=reservation.buffers)
        )
        assert sup.launch(reservation, weights)
        await sup.drain()

    assert torch.equal(sink.by_step()[1].data["logits"], logits(model, input_ids()))


async def test_a_state_dict_that_cannot_be_written_is_refused_and_the_step_stays_free(tmp_path):
    async with EvalSupervisor.open(
        EvalConfig(hf_dir=tmp_path / "hf"), eval_fn=ListFiles(), sink=MemorySink()
    ) as sup:
        with pytest.raises(SubmitError, match=r"state_dict\['step'\] is a int"):
            await sup.submit(1, state_dict={"w": torch.ones(2), "step": 3})
        assert await sup.submit(1, state_dict={"w": torch.ones(2)})


class GatedWrite:
    """Replaces the exporter's write: the first call holds the buffers until ``go`` is set."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.go = threading.Event()
        self.finished = threading.Event()
        self.calls = 0

    def __call__(self, weights: Any, directory: str, **kwargs: Any) -> None:
        self.calls += 1
        if self.calls > 1:
            _write.write_snapshot(weights, directory, **kwargs)
            return
        try:
            with weights.reading():
                self.inside.set()
                self.go.wait()
        finally:
            self.finished.set()


@pytest.mark.timeout(60)
async def test_superseded_write_keeps_its_buffers_until_its_thread_stops(tmp_path, monkeypatch):
    gate = GatedWrite()
    monkeypatch.setattr(exporter, "write_snapshot", gate)
    model, ids = tiny_llama(), input_ids()
    sink = MemorySink()
    admitted = []

    config = EvalConfig(hf_dir=tmp_path / "hf", max_in_flight=1, overflow="latest")
    async with EvalSupervisor.open(config, eval_fn=LoadAndScore(), sink=sink) as sup:
        await sup.submit(0, model=model)
        await trio.to_thread.run_sync(gate.inside.wait)
        train_step(model, ids)
        expected = logits(model, ids)

        async def submit_next() -> None:
            admitted.append(await sup.submit(1, model=model))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(submit_next)
            await trio.testing.wait_all_tasks_blocked()
            assert sink.by_step()[0].reason == "superseded"
            assert admitted == []
            gate.go.set()
        await sup.drain()

    assert admitted == [True]
    assert torch.equal(sink.by_step()[1].data["logits"], expected)
    assert sorted(os.listdir(tmp_path / "hf")) == ["journal.jsonl", "step_1"]


async def test_export_timeout_abandons_the_write_and_its_buffers_stay_out_of_reach(
    tmp_path, monkeypatch, autojump_clock
):
    gate = GatedWrite()
    monkeypatch.setattr(exporter, "write_snapshot", gate)
    model = tiny_llama()
    sink = MemorySink()
    config = EvalConfig(
        hf_dir=tmp_path / "hf", max_in_flight=1, overflow="skip", export_timeout=30
    )
    async with EvalSupervisor.open(config, eval_fn=ListFiles(), sink=sink) as sup:
        assert await sup.submit(0, model=model)
        await trio.to_thread.run_sync(gate.inside.wait)
        # Virtual time stands still while the export thread runs: the test moves it.
        autojump_clock.jump(30)
        await sup.drain()
        assert sink.by_step()[0].reason == "export_timeout"
        assert sup.statistics().in_flight == 0

        assert await sup.submit(1, model=model) is False
        assert sink.by_step()[1].reason == "busy"

        gate.go.set()
        await trio.to_thread.run_sync(gate.finished.wait)
        assert await sup.submit(2, model=model)
        await sup.drain()

    assert sink.by_step()[2].ok
    assert sorted(os.listdir(tmp_path / "hf")) == ["journal.jsonl", "step_2"]

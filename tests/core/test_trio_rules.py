"""trio's rules hold for a trio trainer: file deletes and the weights' copy never stall the
trio thread, and ``submit``, ``drain`` and every close or wait always checkpoint, so a loop
that only awaits ``submit`` lets its points settle."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import trio
import trio.testing

from actorsys import EvalConfig, EvalSupervisor, MemorySink, Outcome, staging
from actorsys._core import supervisor as supervisor_module
from actorsys.fleet._proc.process import spawn
from actorsys.fleet.pin.reference import ReferenceWorker
from tests.conftest import snapshot_dirs, tmp_dirs
from tests.fakes import RecordingEval, tiny_state_dict, written_export


class HeldFirstRetire:
    """Replaces ``staging.retire``: the first delete waits, in its worker thread, until the
    test releases it."""

    def __init__(self) -> None:
        self.real = staging.retire
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def __call__(self, path: str) -> None:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            self.release.wait()
        self.real(path)


class SettledSink(MemorySink):
    """A MemorySink whose test can wait for one step to settle."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step
        self.settled = trio.Event()

    def record(self, outcome: Outcome) -> None:
        super().record(outcome)
        if outcome.step == self.step:
            self.settled.set()


@pytest.mark.timeout(30)
async def test_a_retire_in_progress_does_not_stall_the_next_point(
    staging_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    retire = HeldFirstRetire()
    monkeypatch.setattr(staging, "retire", retire)
    sink = SettledSink(step=2)
    config = EvalConfig(hf_dir=staging_dir, max_in_flight=2, keep_snapshots=0)
    try:
        async with EvalSupervisor.open(config, eval_fn=RecordingEval(), sink=sink) as sup:
            await sup.submit(1, export=written_export)
            await trio.to_thread.run_sync(retire.entered.wait)

            await sup.submit(2, export=written_export)
            await sink.settled.wait()
            assert [(o.step, o.ok) for o in sink.outcomes] == [(1, True), (2, True)]
            assert snapshot_dirs(staging_dir) == ["step_1", "step_2"]
            assert sup.statistics().in_flight == 0

            retire.release.set()
            await sup.drain()
    finally:
        retire.release.set()
    assert snapshot_dirs(staging_dir) == [] and tmp_dirs(staging_dir) == []


async def test_a_trainer_that_only_awaits_submit_lets_its_points_settle(tmp_path: Path) -> None:
    sink = MemorySink()
    config = EvalConfig(max_in_flight=1, overflow="skip")
    weights = torch.randn(256, 256)
    async with EvalSupervisor.open(config, eval_fn=RecordingEval(), sink=sink) as sup:
        for step in range(200):
            for _ in range(20):  # a training step: real work on this thread, no await
                weights = torch.tanh(weights @ weights)
            await sup.submit(step, checkpoint_dir=tmp_path)
        evaluated_while_training = [o.step for o in sink.outcomes if o.ok]
        await sup.drain()
    assert len(evaluated_while_training) >= 2


async def test_submit_and_drain_always_checkpoint(staging_dir: Path, tmp_path: Path) -> None:
    config = EvalConfig(hf_dir=staging_dir, max_in_flight=1, overflow="skip")
    async with EvalSupervisor.open(config, eval_fn=RecordingEval()) as sup:
        with trio.testing.assert_checkpoints():
            await sup.drain()
        with trio.testing.assert_checkpoints():
            assert await sup.submit(1, checkpoint_dir=tmp_path)
        with trio.testing.assert_checkpoints():
            assert not await sup.submit(2, state_dict=tiny_state_dict())
        with trio.testing.assert_checkpoints():
            await sup.drain()


class HeldCopy:
    """Replaces the supervisor's ``capture``: the copy waits, in its thread, until the test
    releases it; remembers the thread it ran in and when it ended."""

    def __init__(self) -> None:
        self.real = supervisor_module.capture
        self.entered = threading.Event()
        self.release = threading.Event()
        self.threads: list[int] = []
        self.finished = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.append(threading.get_ident())
        self.entered.set()
        assert self.release.wait(20), "the test never released the copy"
        weights = self.real(*args, **kwargs)
        self.finished = True
        return weights


@pytest.mark.timeout(30)
async def test_submit_copies_the_weights_in_a_worker_thread_while_other_tasks_run(
    staging_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = HeldCopy()
    monkeypatch.setattr(supervisor_module, "capture", copy)
    sink = SettledSink(step=1)
    config = EvalConfig(hf_dir=staging_dir, max_in_flight=1)

    async def run_while_copying() -> None:
        # Only a trio thread left free during the copy takes this thread's result back.
        await trio.to_thread.run_sync(copy.entered.wait)
        copy.release.set()

    async with EvalSupervisor.open(config, eval_fn=RecordingEval(), sink=sink) as sup:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_while_copying)
            assert await sup.submit(1, state_dict=tiny_state_dict())
            assert copy.finished  # submit returned only after the copy
        await sink.settled.wait()
    assert copy.threads and copy.threads[0] != threading.get_ident()
    assert [(o.step, o.ok) for o in sink.outcomes] == [(1, True)]


@pytest.mark.timeout(30)
async def test_a_submit_cancelled_during_its_copy_still_returns_after_the_copy(
    staging_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = HeldCopy()
    monkeypatch.setattr(supervisor_module, "capture", copy)
    sink = SettledSink(step=1)
    config = EvalConfig(hf_dir=staging_dir, max_in_flight=1)
    async with EvalSupervisor.open(config, eval_fn=RecordingEval(), sink=sink) as sup:
        with trio.CancelScope() as scope:
            async def cancel_during_copy() -> None:
                await trio.to_thread.run_sync(copy.entered.wait)
                scope.cancel()
                copy.release.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_during_copy)
                admitted = await sup.submit(1, state_dict=tiny_state_dict())
        assert admitted and copy.finished
        await sink.settled.wait()
    assert [(o.step, o.ok) for o in sink.outcomes] == [(1, True)]


async def test_closing_a_supervisor_is_a_checkpoint_also_when_it_never_ran_or_closed_already(
    staging_dir: Path,
) -> None:
    config = EvalConfig(hf_dir=staging_dir)
    never_opened = EvalSupervisor(config, eval_fn=RecordingEval())
    with trio.testing.assert_checkpoints():
        assert (await never_opened.aclose()).clean
    async with EvalSupervisor.open(config, eval_fn=RecordingEval()) as sup:
        pass
    with trio.testing.assert_checkpoints():
        assert (await sup.aclose()).clean


async def test_closing_a_reference_worker_that_never_started_is_a_checkpoint() -> None:
    worker = ReferenceWorker()
    with trio.testing.assert_checkpoints():
        await worker.aclose()
    assert worker.pid is None


@pytest.mark.timeout(30)
async def test_waiting_for_a_process_that_already_exited_is_a_checkpoint() -> None:
    process = spawn("exits", [sys.executable, "-c", "pass"], grace=1.0)
    assert await process.wait() == 0
    with trio.testing.assert_checkpoints():
        assert await process.wait() == 0


@pytest.fixture
def staging_dir(tmp_path: Path) -> Path:
    path = tmp_path / "staging"
    path.mkdir()
    return path

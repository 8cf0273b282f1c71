"""trio's rules hold for a trio trainer: file deletes never stall the trio thread, and
``submit`` and ``drain`` always checkpoint, so a loop that only awaits ``submit`` lets its
points settle."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
import trio
import trio.testing

from actorsys import EvalConfig, EvalSupervisor, MemorySink, Outcome, staging
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


@pytest.fixture
def staging_dir(tmp_path: Path) -> Path:
    path = tmp_path / "staging"
    path.mkdir()
    return path

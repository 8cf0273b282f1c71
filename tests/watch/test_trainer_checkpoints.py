"""``watch`` over the ``checkpoint-N`` directories a real ``transformers.Trainer`` wrote: each is
complete once the trainer saved its state, with no ``--quiet-seconds``; ``--marker`` narrows
that to the checkpoints holding the named file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import trio

from tests.watch.test_watch import Recording, watcher
from tests.watch.trainer_run import train_with_checkpoints

# A training run made once for the module: its tests share one worker.
pytestmark = pytest.mark.xdist_group("watch/test_trainer_checkpoints")

STEPS = 6
SAVE_STEPS = 2


@pytest.fixture(scope="module")
def trainer_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("trainer") / "run"
    names = train_with_checkpoints(output, steps=STEPS, save_steps=SAVE_STEPS)
    assert names == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    return output


@pytest.fixture
def run_dir(trainer_output: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trainer_output, copy, symlinks=True)
    return copy


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_watch_once_evaluates_every_trainer_checkpoint_without_quiet_seconds(
    run_dir: Path, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    evals = Recording()
    report = await watcher(run_dir, tmp_path / "out", evals).run()
    assert evals.seen == [2, 4, 6] and report.ok == [2, 4, 6]


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_trainer_checkpoint_without_its_state_is_not_yet_complete(
    run_dir: Path, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    (run_dir / "checkpoint-6" / "trainer_state.json").unlink()
    evals = Recording()
    await watcher(run_dir, tmp_path / "out", evals).run()
    assert evals.seen == [2, 4]


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_marker_stable_evaluates_only_the_marked_checkpoints(
    run_dir: Path, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    for name in ("checkpoint-2", "checkpoint-6"):
        (run_dir / name / "STABLE").write_bytes(b"")
    evals = Recording()
    report = await watcher(run_dir, tmp_path / "out", evals, marker="STABLE").run()
    assert evals.seen == [2, 6] and report.ok == [2, 6]

"""Resume: at open, the points a crashed run admitted and never settled are evaluated again
where their snapshots are complete (EvalConfig.resume), before new points, and the rest are
retired; each settles once in the journal across the crash.

The crashed run is laid out here with the journal's and the staging dir's own functions (as a
run killed at that moment leaves it); tests/core/test_resume_after_kill.py kills a real one.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from actorsys import (
    CheckpointEvalFn,
    ConfigError,
    EvalConfig,
    EvalSupervisor,
    MemorySink,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from actorsys import staging as snapshots
from actorsys._core.journal import (
    JOURNAL_NAME,
    REUSE_JOURNAL_NAME,
    Admitted,
    admitted_line,
    read_pending,
    settled_line,
)
from actorsys._core.resume import decide, is_complete
from actorsys.actors.point import Point, Source
from tests.conftest import snapshot_dirs, tmp_dirs
from tests.fakes import written_export


class ReadingEval(CheckpointEvalFn):
    """Reads the weight file of each checkpoint it is given (in its eval thread)."""

    runtime = "thread"

    def __init__(self) -> None:
        self.seen: list[tuple[int, str, bytes]] = []

    def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        weights = Path(checkpoint_dir, "model.safetensors").read_bytes()
        self.seen.append((input.rollout_id, checkpoint_dir, weights))
        return RolloutFnEvalOutput(data={}, metrics={"score": 1.0})


def weights_of(step: int) -> bytes:
    return f"the weights of step {step}".encode()


def publish(hf: Path, step: int) -> None:
    """A snapshot of ``step`` as the Exporter publishes one."""
    tmp = snapshots.new_tmp_dir(str(hf), step)
    Path(tmp, "model.safetensors").write_bytes(weights_of(step))
    snapshots.seal(tmp)
    snapshots.install(tmp, snapshots.final_dir(str(hf), step))


def cut_short(hf: Path, step: int) -> None:
    """An export of ``step`` the crash cut short: a marked tmp dir, half written, no seal."""
    tmp = snapshots.new_tmp_dir(str(hf), step)
    Path(tmp, "model.safetensors").write_bytes(weights_of(step)[:5])


def admit(hf: Path, step: int) -> None:
    append(hf, admitted_line(Point(step, Source.EXPORT), str(hf), resumed=False))


def append(hf: Path, line: str) -> None:
    with (hf / JOURNAL_NAME).open("a") as file:
        file.write(line)


def crashed_run(hf: Path) -> None:
    """Step 1 settled (its snapshot kept by the ring); 2 and 3 published and in flight; 4
    half exported: the trainer was killed then."""
    for step in (1, 2, 3, 4):
        admit(hf, step)
    publish(hf, 1)
    append(hf, settled_line(1, "ok", None))
    publish(hf, 2)
    publish(hf, 3)
    cut_short(hf, 4)


def settles(hf: Path) -> list[tuple[int, str, str | None]]:
    rows = [json.loads(line) for line in (hf / JOURNAL_NAME).read_text().splitlines()]
    return sorted((r["step"], r["status"], r["reason"]) for r in rows if r["event"] == "settled")


# -- the decision -------------------------------------------------------------------------


def entry(step: int, source: str = "weights", snapshot: str | None = "/hf/step") -> Admitted:
    return Admitted(step, source, snapshot, owned=source != "checkpoint", require_marker=False,
                    time=0.0)


def test_only_unsettled_points_with_a_complete_checkpoint_are_evaluated_again() -> None:
    complete = {3, 1, 5}
    pending = [entry(3), entry(1), entry(2), entry(4, snapshot=None), entry(5, "checkpoint"),
               entry(6, "served"), entry(7)]
    decision = decide(pending, resume=True, complete=lambda e: e.step in complete)
    assert [e.step for e in decision.resume] == [1, 3, 5]
    # No snapshot (a point of the weights an engine served), a source unknown here, or an
    # incomplete snapshot: never evaluated again.
    assert [e.step for e in decision.rest] == [2, 4, 6, 7]


def test_without_resume_nothing_is_evaluated_again() -> None:
    decision = decide([entry(1), entry(2)], resume=False, complete=lambda e: True)
    assert decision.resume == () and [e.step for e in decision.rest] == [1, 2]


def test_a_snapshot_sealed_before_its_point_was_admitted_is_an_earlier_points(staging: Path) -> None:
    publish(staging, 5)
    admit(staging, 5)
    [pending] = read_pending(str(staging / JOURNAL_NAME))
    assert is_complete(pending, str(staging))
    an_hour_ago = time.time() - 3600
    os.utime(staging / "step_5" / snapshots.COMPLETE, (an_hour_ago, an_hour_ago))
    assert not is_complete(pending, str(staging))


# -- the supervisor -----------------------------------------------------------------------


async def test_resume_evaluates_the_crashed_runs_complete_points_first_and_retires_the_rest(
    staging: Path, sink: MemorySink
) -> None:
    crashed_run(staging)
    eval_fn = ReadingEval()
    config = EvalConfig(hf_dir=staging, keep_snapshots=3, resume=True)
    async with EvalSupervisor.open(config, eval_fn=eval_fn, sink=sink) as sup:
        assert tmp_dirs(staging) == []  # the half export of step 4 is gone
        await sup.submit(5, export=written_export)
        assert await sup.submit(3, export=written_export) is False  # resumed instead
        await sup.drain()
    assert [(o.step, o.status) for o in sink.outcomes] == [(2, "ok"), (3, "ok"), (5, "ok")]
    assert [step for step, _, _ in eval_fn.seen] == [2, 3, 5]  # the crashed run's first
    for step, directory, weights in eval_fn.seen[:2]:
        assert directory == str(staging / f"step_{step}") and weights == weights_of(step)
    assert sink.by_step()[2].snapshot == str(staging / "step_2")
    assert snapshot_dirs(staging) == ["step_1", "step_2", "step_3", "step_5"]
    assert settles(staging) == [(1, "ok", None), (2, "ok", None), (3, "ok", None),
                                (4, "skipped", "crashed"), (5, "ok", None)]

    # Each point settled once: opened again, nothing is left to resume.
    again = MemorySink()
    async with EvalSupervisor.open(config, eval_fn=ReadingEval(), sink=again) as sup:
        await sup.drain()
    assert again.outcomes == [] and len(settles(staging)) == 5


async def test_without_resume_the_crashed_runs_points_are_retired_and_reach_no_sink(
    staging: Path, sink: MemorySink
) -> None:
    crashed_run(staging)
    eval_fn = ReadingEval()
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging), eval_fn=eval_fn, sink=sink) as sup:
        await sup.drain()
    assert sink.outcomes == [] and eval_fn.seen == []
    # The unsettled points' snapshots are retired; step 1 settled, and its snapshot stays.
    assert snapshot_dirs(staging) == ["step_1"] and tmp_dirs(staging) == []
    assert settles(staging) == [(1, "ok", None), (2, "skipped", "crashed"),
                                (3, "skipped", "crashed"), (4, "skipped", "crashed")]


async def test_a_snapshot_an_earlier_point_left_under_the_same_name_is_neither_resumed_nor_retired(
    staging: Path, sink: MemorySink
) -> None:
    publish(staging, 6)  # kept by the ring of an earlier run, which settled it an hour ago
    an_hour_ago = time.time() - 3600
    os.utime(staging / "step_6" / snapshots.COMPLETE, (an_hour_ago, an_hour_ago))
    admit(staging, 6)  # the crashed run admitted step 6 again, and died before its export
    config = EvalConfig(hf_dir=staging, resume=True)
    async with EvalSupervisor.open(config, eval_fn=ReadingEval(), sink=sink) as sup:
        await sup.drain()
    assert sink.outcomes == []
    assert snapshot_dirs(staging) == ["step_6"]
    assert settles(staging) == [(6, "skipped", "crashed")]


async def test_reuse_mode_resumes_from_the_trainers_checkpoints_and_deletes_none(
    tmp_path: Path, sink: MemorySink
) -> None:
    ckpt = tmp_path / "ckpt"
    config = EvalConfig(save_hf=f"{ckpt}/{{step}}", resume=True)
    for step, marked in ((10, True), (20, False)):  # 20: the trainer's save was cut short
        (ckpt / str(step)).mkdir(parents=True)
        (ckpt / str(step) / "model.safetensors").write_bytes(weights_of(step))
        if marked:
            (ckpt / str(step) / ".complete").write_bytes(b"")
        line = admitted_line(Point(step, Source.CHECKPOINT, checkpoint=str(ckpt / str(step)),
                                   require_marker=True), None, resumed=False)
        with (ckpt / REUSE_JOURNAL_NAME).open("a") as file:
            file.write(line)
    eval_fn = ReadingEval()
    async with EvalSupervisor.open(config, eval_fn=eval_fn, sink=sink) as sup:
        await sup.drain()
    assert [(o.step, o.status, o.snapshot) for o in sink.outcomes] == [(10, "ok", str(ckpt / "10"))]
    assert eval_fn.seen == [(10, str(ckpt / "10"), weights_of(10))]
    assert sorted(os.listdir(ckpt)) == [REUSE_JOURNAL_NAME, "10", "20"]
    assert sorted(os.listdir(ckpt / "20")) == ["model.safetensors"]
    assert read_pending(str(ckpt / REUSE_JOURNAL_NAME)) == []


def test_resume_needs_a_place_for_its_journal() -> None:
    with pytest.raises(ConfigError, match="^resume: needs hf_dir"):
        EvalConfig(resume=True)
    with pytest.raises(ConfigError, match="^resume: expected True or False"):
        EvalConfig(hf_dir="/x", resume="yes")  # type: ignore[arg-type]

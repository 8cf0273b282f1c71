"""The journal of a supervisor's points: whole fsynced lines, a torn last line ignored, every
point admitted once and settled once, where reuse mode keeps it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

from actorsys import EvalConfig, EvalSupervisor, MemorySink
from actorsys import staging as snapshots
from actorsys._core.journal import (
    JOURNAL_NAME,
    REUSE_JOURNAL_NAME,
    Journal,
    admitted_line,
    journal_path,
    read_pending,
    settled_line,
)
from actorsys.actors.point import Point, Source
from actorsys.runtime import ThreadTracker
from tests.fakes import SkippingEval, written_export


def journal_rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def events(path: Path) -> list[tuple[object, object]]:
    return [(row["event"], row["step"]) for row in journal_rows(path)]


async def test_every_point_is_admitted_once_and_settled_once_in_whole_lines(
    staging: Path, sink: MemorySink
) -> None:
    config = EvalConfig(hf_dir=staging, keep_snapshots=1)
    async with EvalSupervisor.open(config, eval_fn=SkippingEval("not_today"), sink=sink) as sup:
        for step in (1, 2, 3):
            await sup.submit(step, export=written_export)
        await sup.drain()
    path = staging / JOURNAL_NAME
    assert path.read_bytes().endswith(b"\n")
    rows = journal_rows(path)  # every line is whole JSON
    assert sorted(events(path)) == sorted(
        [("admitted", s) for s in (1, 2, 3)] + [("settled", s) for s in (1, 2, 3)]
    )
    for step in (1, 2, 3):
        admitted = next(r for r in rows if r["event"] == "admitted" and r["step"] == step)
        assert admitted["snapshot"] == str(staging / f"step_{step}")
        assert (admitted["source"], admitted["owned"], admitted["resumed"]) == ("export", True, False)
        assert events(path).index(("admitted", step)) < events(path).index(("settled", step))
    settled = [(r["step"], r["status"], r["reason"]) for r in rows if r["event"] == "settled"]
    assert sorted(settled) == [(s, "skipped", "not_today") for s in (1, 2, 3)]
    assert read_pending(str(path)) == []


async def test_a_torn_last_line_is_ignored_and_the_next_line_starts_whole(staging: Path) -> None:
    path = staging / JOURNAL_NAME
    journal = Journal(str(path), str(staging), ThreadTracker())
    for step in (1, 2):
        journal.admitted(Point(step, Source.WEIGHTS))
    await journal.flush()
    with path.open("ab") as file:  # a crash in the middle of the settle of step 2
        file.write(settled_line(2, "ok", None).encode()[:20])
    assert [p.step for p in read_pending(str(path))] == [1, 2]

    journal.admitted(Point(3, Source.WEIGHTS))
    await journal.flush()
    assert [p.step for p in read_pending(str(path))] == [1, 2, 3]
    assert path.read_text().splitlines()[-1].startswith('{"event": "admitted", "step": 3')


def test_a_settled_line_closes_only_the_admission_before_it(staging: Path) -> None:
    path = staging / JOURNAL_NAME
    lines = [
        admitted_line(Point(5, Source.WEIGHTS), str(staging), resumed=False),
        settled_line(5, "ok", None),
        # A later run evaluates step 5 again and crashes with it in flight.
        admitted_line(Point(5, Source.EXPORT), str(staging), resumed=False),
        settled_line(6, "skipped", "busy"),  # refused at admission: never admitted
    ]
    path.write_text("".join(lines))
    [pending] = read_pending(str(path))
    assert (pending.step, pending.source, pending.snapshot) == (5, "export", str(staging / "step_5"))


def test_lines_that_are_not_the_journals_are_ignored(staging: Path) -> None:
    path = staging / JOURNAL_NAME
    path.write_text(
        "[1, 2]\n"
        '{"event": "admitted", "step": "7"}\n'
        '{"event": "admitted", "step": 8, "source": 3}\n'
        + admitted_line(Point(9, Source.CHECKPOINT, checkpoint="/ckpt/9"), None, resumed=False)
    )
    [pending] = read_pending(str(path))
    assert (pending.step, pending.snapshot, pending.owned) == (9, "/ckpt/9", False)


def test_a_missing_journal_shows_nothing_pending(staging: Path) -> None:
    assert read_pending(str(staging / JOURNAL_NAME)) == []


@pytest.mark.parametrize(
    ("pattern", "directory"),
    [("/ckpt/hf/{step}", "/ckpt/hf"), ("/ckpt/step_{step}/hf", "/ckpt"),
     ("/ckpt/hf/checkpoint-{step}", "/ckpt/hf")],
)
def test_reuse_mode_keeps_its_journal_beside_the_trainers_checkpoints(
    pattern: str, directory: str
) -> None:
    assert journal_path(EvalConfig(save_hf=pattern), None) == os.path.join(directory, REUSE_JOURNAL_NAME)


def test_the_staging_dir_holds_the_journal_and_without_either_dir_there_is_none() -> None:
    assert journal_path(EvalConfig(hf_dir="/x"), "/x") == "/x/journal.jsonl"
    assert journal_path(EvalConfig(), None) is None


async def test_a_snapshot_is_deleted_only_once_the_line_that_settles_its_point_is_on_disk(
    staging: Path, sink: MemorySink, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def never_writes(self: Journal) -> None:  # only the Retirer's delete thread writes now
        await trio.sleep_forever()

    on_disk_at_delete: list[tuple[str, list[tuple[object, object]]]] = []
    retire = snapshots.retire

    def watched_retire(path: str) -> None:
        journal = staging / JOURNAL_NAME
        on_disk_at_delete.append((os.path.basename(path), events(journal) if journal.exists() else []))
        retire(path)

    monkeypatch.setattr(Journal, "run", never_writes)
    monkeypatch.setattr(snapshots, "retire", watched_retire)
    config = EvalConfig(hf_dir=staging, keep_snapshots=0)
    async with EvalSupervisor.open(config, eval_fn=SkippingEval("not_today"), sink=sink) as sup:
        await sup.submit(1, export=written_export)
        await sup.drain()
    assert on_disk_at_delete == [("step_1", [("admitted", 1), ("settled", 1)])]

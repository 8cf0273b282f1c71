"""Retirer: the snapshot ring, skipped points' snapshots, and the sinks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actorsys import EvalConfig, EvalSupervisor, JsonlSink, MemorySink, Outcome
from tests.conftest import snapshot_dirs, tmp_dirs
from tests.fakes import RecordingEval, SkippingEval, tiny_state_dict


@pytest.mark.parametrize(("keep", "left"), [(0, []), (1, ["step_4"]), (2, ["step_3", "step_4"])])
async def test_ring_keeps_the_newest_evaluated_snapshots(staging: Path, keep: int, left: list[str]) -> None:
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging, keep_snapshots=keep),
                                   eval_fn=RecordingEval()) as sup:
        for step in range(1, 5):
            await sup.submit(step, state_dict=tiny_state_dict())
            await sup.drain()
    assert snapshot_dirs(staging) == left and tmp_dirs(staging) == []


async def test_snapshot_of_a_skipped_point_is_retired_at_once(staging: Path, sink: MemorySink) -> None:
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging, keep_snapshots=5),
                                   eval_fn=SkippingEval("bad_format"), sink=sink) as sup:
        await sup.submit(1, state_dict=tiny_state_dict())
    assert sink.outcomes[0].reason == "bad_format"
    assert [p.name for p in staging.iterdir()] == ["journal.jsonl"]


async def test_every_point_settles_exactly_once_in_the_sink(staging: Path, sink: MemorySink) -> None:
    async with EvalSupervisor.open(EvalConfig(hf_dir=staging, max_in_flight=3), eval_fn=RecordingEval(),
                                   sink=sink) as sup:
        for step in range(10):
            await sup.submit(step, state_dict=tiny_state_dict())
    assert sorted(o.step for o in sink.outcomes) == list(range(10))
    assert sup.statistics().settled == 10 and sup.statistics().ok == 10


def test_jsonl_sink_writes_one_object_a_line(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "outcomes.jsonl")
    sink.record(Outcome(step=1, status="ok", metrics={"eval/acc": 0.5}, data={"n": 3}, weight_version="1"))
    sink.record(Outcome(step=2, status="skipped", reason="busy"))
    sink.close()
    lines = [json.loads(line) for line in (tmp_path / "outcomes.jsonl").read_text().splitlines()]
    assert lines[0] == {"step": 1, "status": "ok", "reason": None, "metrics": {"eval/acc": 0.5},
                        "data": {"n": 3}, "weight_version": "1", "snapshot": None}
    assert lines[1]["reason"] == "busy"

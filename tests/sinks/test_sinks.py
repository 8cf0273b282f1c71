"""Sinks: a sequence fans out and survives a failing sink; TensorBoard and wandb files read
back hold every point at its step, a lagged one included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from actorsys import (
    ConfigError,
    EvalConfig,
    EvalSupervisor,
    JsonlSink,
    MemorySink,
    Outcome,
    TensorBoardSink,
    WandbSink,
)
from actorsys.sinks.fanout import FanoutSink, as_sink
from tests.fakes import RecordingEval, tiny_state_dict
from tests.sinks.wandb_records import history_rows, step_metrics

# Settle order as a lagged pipeline produces it: step 20 lands after step 30.
OUTCOMES = [
    Outcome(10, "ok", metrics={"eval/acc": 0.1, "eval/lag_steps": 3.0}),
    Outcome(30, "ok", metrics={"eval/acc": 0.3, "eval/lag_steps": 1.0}),
    Outcome(20, "ok", metrics={"eval/acc": 0.2, "eval/lag_steps": 15.0}),
    Outcome(40, "skipped", reason="timeout", metrics={"eval/lag_steps": 2.0}),
]


class Exploding:
    def __init__(self) -> None:
        self.closed = False

    def record(self, outcome: Outcome) -> None:
        raise RuntimeError("disk full")

    def close(self) -> None:
        self.closed = True
        raise RuntimeError("still full")


def test_a_sequence_fans_out_past_a_sink_that_raises() -> None:
    first, last, exploding = MemorySink(), MemorySink(), Exploding()
    fanout = as_sink([first, exploding, last])
    for outcome in OUTCOMES:
        fanout.record(outcome)
    assert first.outcomes == OUTCOMES and last.outcomes == OUTCOMES
    assert isinstance(fanout, FanoutSink)
    fanout.close()
    assert exploding.closed


def test_as_sink_keeps_a_sink_and_makes_a_memory_sink_for_none() -> None:
    sink = MemorySink()
    assert as_sink(sink) is sink
    assert isinstance(as_sink(None), MemorySink)


@pytest.mark.parametrize("bad", [object(), [MemorySink(), "not a sink"], "sink"])
def test_as_sink_names_the_field_for_what_is_no_sink(bad: object) -> None:
    with pytest.raises(ConfigError, match="record"):
        as_sink(bad)  # type: ignore[arg-type]


async def test_the_supervisor_records_into_every_sink_of_a_list(tmp_path: Path) -> None:
    memory, jsonl = MemorySink(), JsonlSink(tmp_path / "metrics.jsonl")
    config = EvalConfig(hf_dir=tmp_path / "staging", keep_snapshots=0)
    async with EvalSupervisor.open(
        config, eval_fn=RecordingEval(), sink=[memory, Exploding(), jsonl]  # type: ignore[arg-type]
    ) as sup:
        await sup.submit(1, state_dict=tiny_state_dict())
        await sup.submit(2, state_dict=tiny_state_dict(1))
        await sup.drain()
    jsonl.close()
    assert [o.step for o in memory.outcomes if o.ok] == [1, 2]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def test_tensorboard_file_holds_every_point_at_its_step(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path / "tb")
    for outcome in OUTCOMES:
        sink.record(outcome)
    sink.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    acc = {e.step: e.value for e in events.Scalars("eval/acc")}
    assert acc == pytest.approx({10: 0.1, 20: 0.2, 30: 0.3})
    assert sorted(e.step for e in events.Scalars("eval/lag_steps")) == [10, 20, 30, 40]
    assert [(e.step, e.value) for e in events.Scalars("eval/skipped_timeout")] == [(40, 1.0)]
    assert "eval/step" not in events.Tags()["scalars"]


def test_offline_wandb_run_holds_every_point_against_eval_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    sink = WandbSink(project="actorsys-test", mode="offline", dir=str(tmp_path))
    run_dir = Path(sink.run.dir).parent
    for outcome in OUTCOMES:
        sink.record(outcome)
    sink.close()
    rows = history_rows(run_dir)
    assert [(row["eval/step"], row.get("eval/acc")) for row in rows] == [
        (10, 0.1), (30, 0.3), (20, 0.2), (40, None)
    ]
    assert rows[-1]["eval/skip_reason"] == "timeout" and rows[-1]["eval/skipped_timeout"] == 1
    assert step_metrics(run_dir)["eval/*"] == "eval/step"


def test_the_bridge_records_into_every_sink_of_a_list(tmp_path: Path) -> None:
    from bridge import EvalBridge

    first, last = MemorySink(), MemorySink()
    config = EvalConfig(hf_dir=tmp_path / "staging", keep_snapshots=0)
    sinks = [first, Exploding(), last]
    with EvalBridge(config, eval_fn=RecordingEval(), sink=sinks) as bridge:  # type: ignore[arg-type]
        bridge.submit(1, state_dict=tiny_state_dict())
        report = bridge.drain(timeout=30)
    assert report.settled == [1]
    assert [o.step for o in first.outcomes] == [1] and [o.step for o in last.outcomes] == [1]


def test_jsonl_sink_records_without_touching_the_file_and_counts_a_failed_write(
    tmp_path: Path,
) -> None:
    sink = JsonlSink(tmp_path / "missing-dir" / "metrics.jsonl")
    sink.record(OUTCOMES[0])
    assert sink.flush(timeout=30)
    assert sink.errors == 1
    sink.close()


@pytest.mark.timeout(60)
def test_jsonl_sink_left_open_writes_every_line_by_interpreter_exit(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    code = (
        "import sys\n"
        "from actorsys import JsonlSink, Outcome\n"
        "sink = JsonlSink(sys.argv[1])\n"
        "for step in range(500):\n"
        "    sink.record(Outcome(step=step, status='ok'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == list(range(500))

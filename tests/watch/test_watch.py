"""The watch loop over real directories and a real supervisor, with fake engines and eval fns:
what is due, in which order, what the ledger says afterwards."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from actorsys import CheckpointEvalFn, EvalSkip, Fleet, RolloutFnEvalInput, RolloutFnEvalOutput
from actorsys.watch.ledger import Ledger
from actorsys.watch.scan import Checkpoint, fingerprint
from actorsys.watch.service import Watcher, WatchSettings
from tests.fakes import FakeEngine, GatedEval

KEY = "settings-a"


class Recording(CheckpointEvalFn):
    """Scores each checkpoint by its step; fails the steps in ``poison``."""

    def __init__(self, poison: Sequence[int] = ()) -> None:
        self.seen: list[int] = []
        self.poison = set(poison)

    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        await trio.lowlevel.checkpoint()
        self.seen.append(input.rollout_id)
        if input.rollout_id in self.poison:
            raise EvalSkip("bad_checkpoint", "told to")
        return RolloutFnEvalOutput(data={}, metrics={"eval/score": float(input.rollout_id)})


def checkpoint(root: Path, name: str, *, marker: bool = True, weights: bool = True) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    if weights:
        (path / "model.safetensors").write_bytes(b"w")
    if marker:
        (path / ".complete").write_bytes(b"")
    return path


def fleets_of(count: int):  # type: ignore[no-untyped-def]
    @asynccontextmanager
    async def open_fleets(first: Checkpoint) -> AsyncIterator[list[Fleet]]:
        yield [Fleet([FakeEngine(f"e{i}")]) for i in range(count)]

    return open_fleets


def watcher(root: Path, out: Path, eval_fn: Any, *, key: str = KEY, fleets: int = 1,
            **settings: Any) -> Watcher:
    return Watcher(
        WatchSettings(root=str(root), out=str(out), once=True, poll_interval=1.0, **settings),
        eval_fn=eval_fn, eval_key=key, fleets_for=fleets_of(fleets),
    )


def ledger_lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "ckpt"
    root.mkdir()
    for step in (30, 10, 20):
        checkpoint(root, f"step_{step}")
    checkpoint(root, "step_40", marker=False)
    checkpoint(root, "step_50", marker=False, weights=False)
    checkpoint(root, ".tmp-step_60")
    return root, tmp_path / "out"


async def test_once_evaluates_exactly_the_complete_checkpoints_in_step_order(
    dirs: tuple[Path, Path], autojump_clock: trio.testing.MockClock
) -> None:
    root, out = dirs
    evals = Recording()
    report = await watcher(root, out, evals).run()
    assert evals.seen == [10, 20, 30]
    assert report.ok == [10, 20, 30] and not report.failed
    assert [(e["checkpoint"], e["status"]) for e in ledger_lines(out)] == [
        ("step_10", "ok"), ("step_20", "ok"), ("step_30", "ok")
    ]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["metrics"]["eval/score"]) for m in metrics] == [(10, 10.0), (20, 20.0), (30, 30.0)]

    again = Recording()
    report = await watcher(root, out, again).run()
    assert again.seen == [] and report.ok == []


async def test_a_failed_attempt_in_the_ledger_is_retried(
    dirs: tuple[Path, Path], autojump_clock: trio.testing.MockClock
) -> None:
    root, out = dirs
    await watcher(root, out, Recording(poison=[20]), max_attempts=3).run()
    out_lines = ledger_lines(out)
    assert [e["status"] for e in out_lines if e["checkpoint"] == "step_20"] == ["skipped"] * 3 + ["failed"]

    fresh = tmp = out.parent / "out2"
    tmp.mkdir()
    (fresh / "ledger.jsonl").write_text(json.dumps(
        {"checkpoint": "step_20", "fingerprint": fingerprint(str(root / "step_20")), "step": 20,
         "eval_key": KEY, "status": "skipped", "attempt": 1}
    ) + "\n")
    evals = Recording()
    report = await watcher(root, fresh, evals).run()
    assert evals.seen == [10, 20, 30] and report.ok == [10, 20, 30]


async def test_max_attempts_stops_retrying_a_poison_checkpoint(
    dirs: tuple[Path, Path], autojump_clock: trio.testing.MockClock
) -> None:
    root, out = dirs
    evals = Recording(poison=[20])
    report = await watcher(root, out, evals, max_attempts=2).run()
    assert evals.seen.count(20) == 2 and report.failed == [20] and report.ok == [10, 30]
    statuses = [(e["status"], e.get("attempt")) for e in ledger_lines(out) if e["step"] == 20]
    assert statuses == [("skipped", 1), ("skipped", 2), ("failed", None)]

    again = Recording(poison=[20])
    report = await watcher(root, out, again, max_attempts=5).run()
    assert again.seen == [] and report.failed == []


async def test_changed_eval_settings_re_evaluate_the_backlog(
    dirs: tuple[Path, Path], autojump_clock: trio.testing.MockClock
) -> None:
    root, out = dirs
    await watcher(root, out, Recording()).run()
    evals = Recording()
    report = await watcher(root, out, evals, key="settings-b").run()
    assert evals.seen == [10, 20, 30] and report.ok == [10, 20, 30]


async def test_catchup_latest_starts_from_the_newest_complete_checkpoint(
    dirs: tuple[Path, Path], autojump_clock: trio.testing.MockClock
) -> None:
    root, out = dirs
    evals = Recording()
    await watcher(root, out, evals, catchup="latest").run()
    assert evals.seen == [30]


async def test_a_checkpoint_deleted_before_its_turn_is_vanished(
    dirs: tuple[Path, Path], autojump_clock: trio.testing.MockClock
) -> None:
    root, out = dirs
    evals = GatedEval()
    service = watcher(root, out, evals)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.run)
        await evals.wait_started(10)
        shutil.rmtree(root / "step_30")
        evals.release(10)
        evals.release(20)
    assert service.report.vanished == [30] and service.report.ok == [10, 20]
    assert ledger_lines(out)[-1]["status"] == "vanished"
    assert evals.started == [10, 20]


async def test_a_torn_last_ledger_line_is_ignored_and_appends_start_a_new_line(
    dirs: tuple[Path, Path], autojump_clock: trio.testing.MockClock
) -> None:
    root, out = dirs
    out.mkdir()
    done = {"checkpoint": "step_10", "fingerprint": fingerprint(str(root / "step_10")),
            "step": 10, "eval_key": KEY, "status": "ok"}
    (out / "ledger.jsonl").write_text(json.dumps(done) + "\n" + '{"checkpoint": "step_20", "st')
    evals = Recording()
    await watcher(root, out, evals).run()
    assert evals.seen == [20, 30]
    lines = (out / "ledger.jsonl").read_text().splitlines()
    assert lines[1] == '{"checkpoint": "step_20", "st'
    assert [json.loads(line)["checkpoint"] for line in lines[2:]] == ["step_20", "step_30"]
    assert not Ledger(out / "ledger.jsonl").due(
        "step_30", fingerprint(str(root / "step_30")), KEY, max_attempts=3
    )


async def test_parallel_fleets_evaluate_at_once_and_done_lands_in_step_order(
    dirs: tuple[Path, Path], autojump_clock: trio.testing.MockClock
) -> None:
    root, out = dirs
    evals = GatedEval()
    service = watcher(root, out, evals, fleets=2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.run)
        await evals.wait_started(10)
        await evals.wait_started(20)
        evals.release(20)
        await trio.sleep(1)
        assert not (out / "ledger.jsonl").exists()
        evals.release(10)
        evals.release(30)
    assert evals.max_running == 2
    assert [e["step"] for e in ledger_lines(out)] == [10, 20, 30]


async def test_quiet_seconds_takes_an_unmarked_checkpoint_nothing_changed_in(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    root = tmp_path / "ckpt"
    old = checkpoint(root, "iter_0000100", marker=False)
    for path in (old / "config.json", old / "model.safetensors", old):
        os.utime(path, (1_000_000, 1_000_000))
    checkpoint(root, "iter_0000200", marker=False)
    evals = Recording()
    await watcher(root, tmp_path / "out", evals, quiet_seconds=60.0).run()
    assert evals.seen == [100]


async def test_a_checkpoint_rewritten_in_place_is_evaluated_again(
    dirs: tuple[Path, Path], autojump_clock: trio.testing.MockClock
) -> None:
    root, out = dirs
    await watcher(root, out, Recording()).run()
    weights = root / "step_20" / "model.safetensors"
    weights.write_bytes(b"rewritten weights")
    evals = Recording()
    report = await watcher(root, out, evals).run()
    assert evals.seen == [20] and report.ok == [20]


async def test_another_runs_checkpoint_of_the_same_name_is_evaluated(
    dirs: tuple[Path, Path], tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    root, out = dirs
    await watcher(root, out, Recording()).run()
    other = tmp_path / "other-run"
    other.mkdir()
    path = checkpoint(other, "step_10")
    (path / "model.safetensors").write_bytes(b"another run's weights")
    evals = Recording()
    report = await watcher(other, out, evals).run()
    assert evals.seen == [10] and report.ok == [10]


class BadRequestEval(CheckpointEvalFn):
    """Every point skips ``bad_request``, as DatasetEval does when the server refused every
    request as malformed."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        await trio.lowlevel.checkpoint()
        self.seen.append(input.rollout_id)
        raise EvalSkip("bad_request", "HTTP 400: prompt + 256 exceeds the model's 256 positions")


async def test_a_bad_request_is_recorded_failed_at_once_with_its_message(
    dirs: tuple[Path, Path], autojump_clock: trio.testing.MockClock,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from actorsys.cli.watch import PrintSink

    root, out = dirs
    evals = BadRequestEval()
    service = Watcher(
        WatchSettings(root=str(root), out=str(out), once=True, poll_interval=1.0, max_attempts=3),
        eval_fn=evals, eval_key=KEY, fleets_for=fleets_of(1), sink=PrintSink(),
    )
    report = await service.run()
    assert evals.seen == [10, 20, 30] and report.failed == [10, 20, 30]
    entries = [(e["step"], e["status"]) for e in ledger_lines(out)]
    assert entries == [(10, "skipped"), (10, "failed"), (20, "skipped"), (20, "failed"),
                       (30, "skipped"), (30, "failed")]
    assert "exceeds the model's 256 positions" in ledger_lines(out)[1]["error"]
    # Only the sink's lines: a library's log handler (inspect-ai installs one on the root
    # logger) may also write to stdout when an earlier test in this process set it up.
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert printed[0] == (
        "step 10: skipped (bad_request: HTTP 400: prompt + 256 exceeds the model's 256 positions)"
    )


async def test_a_second_watcher_on_the_same_out_is_refused_naming_the_holder(
    dirs: tuple[Path, Path], autojump_clock: trio.testing.MockClock
) -> None:
    from actorsys._errors import WatchOutInUseError

    root, out = dirs
    evals = GatedEval()
    first = watcher(root, out, evals)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(first.run)
        await evals.wait_started(10)
        second = Recording()
        with pytest.raises(WatchOutInUseError, match=f"pid {os.getpid()}"):
            await watcher(root, out, second).run()
        assert second.seen == []
        for step in (10, 20, 30):
            evals.release(step)
    assert first.report.ok == [10, 20, 30]
    assert (await watcher(root, out, Recording()).run()).ok == []


async def test_interrupt_abandons_a_scan_stuck_on_a_hung_filesystem(
    dirs: tuple[Path, Path], autojump_clock: trio.testing.MockClock
) -> None:
    root, out = dirs
    service = Watcher(
        WatchSettings(root=str(root), out=str(out), poll_interval=1.0),
        eval_fn=Recording(), eval_key=KEY, fleets_for=fleets_of(1),
    )
    scanning, unblock = trio.Event(), threading.Event()

    def hung_scan(*, now: float) -> list[Checkpoint]:
        trio.from_thread.run_sync(scanning.set)
        unblock.wait()
        return []

    service.scanner.scan = hung_scan  # type: ignore[method-assign]
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(service.run)
            await scanning.wait()
            with trio.fail_after(service.settings.config.close_timeout + 1):
                await service.interrupt()
        assert service.report.interrupted
        assert service.threads.running() == [f"scan {root}"]
    finally:
        unblock.set()


async def test_a_watch_run_does_no_file_operation_on_the_trio_thread(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    root, out = dirs
    trio_thread = threading.get_ident()
    on_trio_thread: list[str] = []

    def watched(name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == trio_thread:
                on_trio_thread.append(name)
            return fn(*args, **kwargs)
        return call

    for name in ("fsync", "scandir", "lstat", "makedirs", "open"):
        monkeypatch.setattr(os, name, watched(name, getattr(os, name)))
    monkeypatch.setattr("builtins.open", watched("open()", open))
    report = await watcher(root, out, Recording(), quiet_seconds=60.0).run()
    monkeypatch.undo()
    assert report.ok == [10, 20, 30]
    assert on_trio_thread == []


async def test_metrics_rows_are_written_by_the_jsonl_sink_with_the_checkpoint_and_attempt(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    from actorsys.sinks import JsonlSink

    root, out = dirs
    recorded: list[int] = []
    record = JsonlSink.record

    def counting(self: JsonlSink, outcome: Any) -> None:
        recorded.append(outcome.step)
        record(self, outcome)

    monkeypatch.setattr(JsonlSink, "record", counting)
    await watcher(root, out, Recording(poison=[20]), max_attempts=2).run()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert recorded == [row["step"] for row in rows] == [10, 20, 30, 20]
    assert [(r["checkpoint"], r["attempt"], r["eval_key"]) for r in rows] == [
        ("step_10", 1, KEY), ("step_20", 1, KEY), ("step_30", 1, KEY), ("step_20", 2, KEY)
    ]
    assert rows[0]["fingerprint"] == fingerprint(str(root / "step_10"))


class RaisingSink:
    def record(self, outcome: Any) -> None:
        raise OSError("the tracking server is down")


async def test_a_sink_that_raises_is_logged_and_the_watch_goes_on(
    dirs: tuple[Path, Path], autojump_clock: trio.testing.MockClock
) -> None:
    root, out = dirs
    service = Watcher(
        WatchSettings(root=str(root), out=str(out), once=True, poll_interval=1.0),
        eval_fn=Recording(), eval_key=KEY, fleets_for=fleets_of(1), sink=RaisingSink(),
    )
    report = await service.run()
    assert report.ok == [10, 20, 30]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3


async def test_outcomes_handed_over_from_another_thread_are_recorded_in_step_order(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    from actorsys.watch import service as watch_service

    root, out = dirs

    def record_from_a_thread(self: Any, outcome: Any) -> None:
        thread = threading.Thread(target=self.on_record, args=(outcome,))
        thread.start()
        thread.join()

    monkeypatch.setattr(watch_service.CallbackSink, "record", record_from_a_thread)
    report = await watcher(root, out, Recording(), fleets=2).run()
    assert report.ok == [10, 20, 30]
    assert [e["step"] for e in ledger_lines(out)] == [10, 20, 30]


class TrioSink:
    """A sink that wakes a trio task, as a sink of the pipeline may: it must run on the trio
    thread."""

    def __init__(self) -> None:
        self.landed = trio.Event()
        self.steps: list[int] = []

    def record(self, outcome: Any) -> None:
        self.steps.append(outcome.step)
        self.landed.set()


async def test_the_sink_is_called_on_the_trio_thread_as_the_pipeline_calls_sinks(
    dirs: tuple[Path, Path], autojump_clock: trio.testing.MockClock
) -> None:
    root, out = dirs
    sink = TrioSink()
    service = Watcher(
        WatchSettings(root=str(root), out=str(out), once=True, poll_interval=1.0),
        eval_fn=Recording(), eval_key=KEY, fleets_for=fleets_of(1), sink=sink,
    )
    report = await service.run()
    assert report.ok == [10, 20, 30] and sink.steps == [10, 20, 30] and sink.landed.is_set()

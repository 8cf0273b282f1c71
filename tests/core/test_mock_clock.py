"""Under trio's MockClock with autojump, virtual time stands still while actorsys's own worker
threads run: timeouts fire at their virtual time, and ``drain`` returns once its points settled
and what they left on disk is gone (after an export timeout: test_export_stage.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing

from actorsys import EvalConfig, EvalSupervisor, MemorySink
from tests.conftest import snapshot_dirs, tmp_dirs
from tests.fakes import HangingEval, RecordingEval, written_export


async def test_drain_returns_when_an_eval_timeout_point_settles_not_at_its_own_timeout(
    staging: Path, sink: MemorySink, autojump_clock: trio.testing.MockClock
) -> None:
    config = EvalConfig(hf_dir=staging, eval_timeout=50, keep_snapshots=0)
    async with EvalSupervisor.open(config, eval_fn=HangingEval(), sink=sink) as sup:
        await sup.submit(1, export=written_export)
        report = await sup.drain(timeout=1000)
        assert trio.current_time() == 50
    assert report.settled == [1] and report.pending == []
    assert sink.by_step()[1].reason == "timeout"
    assert snapshot_dirs(staging) == [] and tmp_dirs(staging) == []


async def test_many_points_settle_at_their_virtual_times_while_threads_delete(
    staging: Path, sink: MemorySink, autojump_clock: trio.testing.MockClock
) -> None:
    class SleepsStep(RecordingEval):
        async def evaluate_checkpoint(self, checkpoint_dir: str, input: Any) -> Any:
            await trio.sleep(input.rollout_id)
            return await super().evaluate_checkpoint(checkpoint_dir, input)

    config = EvalConfig(hf_dir=staging, max_in_flight=4, keep_snapshots=1, eval_timeout=100)
    async with EvalSupervisor.open(config, eval_fn=SleepsStep(), sink=sink) as sup:
        for step in (1, 2, 3):
            await sup.submit(step, export=written_export)
        report = await sup.drain(timeout=1000)
        assert trio.current_time() == 3 + 2 + 1
    assert report.settled == [1, 2, 3]
    assert [o.ok for o in sink.outcomes] == [True, True, True]
    assert snapshot_dirs(staging) == ["step_3"] and tmp_dirs(staging) == []

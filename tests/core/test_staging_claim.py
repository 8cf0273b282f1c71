"""One hf_dir belongs to one job at a time: a second supervisor opening it is refused with the
holder's pid, and nothing of the first is touched."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from actorsys import ConfigError, EvalConfig, EvalSupervisor, MemorySink, StagingInUseError
from actorsys._core.staging_claim import LOCK_NAME, claim_staging_dir
from tests.conftest import snapshot_dirs, tmp_dirs
from tests.fakes import GatedEval, RecordingEval, written_export


async def test_a_second_supervisor_on_a_held_staging_dir_is_refused_and_touches_nothing(
    staging: Path, sink: MemorySink
) -> None:
    config = EvalConfig(hf_dir=staging, keep_snapshots=1)
    eval_fn = GatedEval()
    async with EvalSupervisor.open(config, eval_fn=eval_fn, sink=sink) as first:
        await first.submit(1, export=written_export)
        await first.submit(2, export=written_export)
        await eval_fn.wait_started(1)
        eval_fn.release(1)
        await eval_fn.wait_started(2)
        before = sorted(os.listdir(staging))
        assert "step_1" in before and "step_2" in before

        with pytest.raises(StagingInUseError) as refused:
            async with EvalSupervisor.open(config, eval_fn=RecordingEval(), sink=MemorySink()):
                raise AssertionError("opened a held staging dir")
        assert refused.value.pid == os.getpid() and str(os.getpid()) in str(refused.value)
        assert isinstance(refused.value, ConfigError) and refused.value.field == "hf_dir"
        assert sorted(os.listdir(staging)) == before

        eval_fn.release(2)
        await first.drain()
    assert [o.step for o in sink.outcomes if o.ok] == [1, 2]
    assert snapshot_dirs(staging) == ["step_2"]


async def test_the_staging_dir_is_free_again_once_its_supervisor_closed(
    staging: Path, sink: MemorySink
) -> None:
    config = EvalConfig(hf_dir=staging, keep_snapshots=0)
    async with EvalSupervisor.open(config, eval_fn=RecordingEval(), sink=sink) as sup:
        await sup.submit(1, export=written_export)
    assert not (staging / LOCK_NAME).exists()
    async with EvalSupervisor.open(config, eval_fn=RecordingEval(), sink=sink) as sup:
        await sup.submit(2, export=written_export)
    assert [o.step for o in sink.outcomes if o.ok] == [1, 2]
    assert os.listdir(staging) == ["journal.jsonl"]


def _hold_then_die(path: str, held: Any, die: Any) -> None:
    claim_staging_dir(path)
    os.mkdir(os.path.join(path, ".tmp-step_7-live"))
    Path(path, ".tmp-step_7-live", ".actorsys").write_bytes(b"")
    held.set()
    die.wait(60)
    os._exit(0)


def test_another_process_holding_the_dir_is_named_and_its_tmp_dirs_survive(staging: Path) -> None:
    context = multiprocessing.get_context("spawn")
    held, die = context.Event(), context.Event()
    holder = context.Process(target=_hold_then_die, args=(str(staging), held, die))
    holder.start()
    try:
        assert held.wait(60)
        with pytest.raises(StagingInUseError) as refused:
            claim_staging_dir(str(staging))
        assert refused.value.pid == holder.pid
        assert tmp_dirs(staging) == [".tmp-step_7-live"]
    finally:
        die.set()
        holder.join(60)
    # The OS released the dead holder's lock: the next job claims the dir and sweeps its tmp dirs.
    claim = claim_staging_dir(str(staging))
    claim.release()
    assert tmp_dirs(staging) == []


def test_ranks_that_do_not_evaluate_open_the_held_dir_without_the_lock(staging: Path) -> None:
    claim = claim_staging_dir(str(staging))
    try:
        os.mkdir(staging / ".tmp-step_3-shard")
        (staging / ".tmp-step_3-shard" / ".actorsys").write_bytes(b"")
        shard_rank = claim_staging_dir(str(staging), lock=False)
        assert shard_rank.path == str(staging) and not shard_rank.locked
        shard_rank.release()
        assert tmp_dirs(staging) == [".tmp-step_3-shard"] and (staging / LOCK_NAME).exists()
    finally:
        claim.release()


def test_a_bridge_on_a_held_staging_dir_raises_staging_in_use_from_its_constructor_block(
    staging: Path,
) -> None:
    from bridge import EvalBridge

    claim = claim_staging_dir(str(staging))
    try:
        with pytest.raises(StagingInUseError) as refused, EvalBridge(
            EvalConfig(hf_dir=staging), eval_fn=RecordingEval()
        ):
            raise AssertionError("opened a held staging dir")
        assert refused.value.pid == os.getpid()
    finally:
        claim.release()

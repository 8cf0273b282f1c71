"""aclose stops the buffer pool's background preparation (a thread inside torch at the
interpreter's exit aborts the process) and names one it could not stop within its budget."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio

from actorsys import EvalConfig, EvalSupervisor, MemorySink
from actorsys.snapshot import BufferPool
from actorsys.snapshot._pool import memory
from actorsys.snapshot._pool.prepare import checkpoint_buffer_nbytes
from tests.fakes import ChunkGate, RecordingEval
from tests.snapshot.snapshot_models import tiny_llama

PREPARER = "actorsys buffer preparation"


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """A base checkpoint: the supervisor faults its buffer sets in for it from the start."""
    path = tmp_path / "base"
    tiny_llama().save_pretrained(path)
    return path


def preparers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == PREPARER and t.is_alive()]


@pytest.mark.timeout(30)
async def test_close_stops_the_preparation_between_chunks_and_is_clean(
    staging: Path, sink: MemorySink, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory, "FAULT_CHUNK_BYTES", 1024)
    gate = ChunkGate(monkeypatch, at=2)
    close = BufferPool.close

    def close_then_go(pool: BufferPool, timeout: float = 0.0) -> bool:
        close(pool)  # the stop flag is set: the held preparation sees it when let go
        gate.go.set()
        return close(pool, timeout)

    monkeypatch.setattr(BufferPool, "close", close_then_go)
    config = EvalConfig(hf_dir=staging, base_checkpoint=base)
    async with EvalSupervisor.open(config, eval_fn=RecordingEval(), sink=sink) as sup:
        assert await trio.to_thread.run_sync(gate.waiting.wait, 10)
        report = await sup.aclose(timeout=10)
    assert report.clean and report.stuck_threads == []
    assert gate.checks == 2  # stopped before its second chunk, no other set started
    assert preparers() == []
    buffers = sup.statistics().buffers
    assert buffers is not None and (buffers.prepared, buffers.preparing) == (0, 0)


@pytest.mark.timeout(30)
async def test_close_names_a_preparation_still_running_after_its_budget(
    staging: Path, sink: MemorySink, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory, "FAULT_CHUNK_BYTES", 1024)
    gate = ChunkGate(monkeypatch, at=2)
    nbytes = checkpoint_buffer_nbytes(str(base))
    config = EvalConfig(hf_dir=staging, base_checkpoint=base)
    try:
        async with EvalSupervisor.open(config, eval_fn=RecordingEval(), sink=sink) as sup:
            assert await trio.to_thread.run_sync(gate.waiting.wait, 10)
            report = await sup.aclose(timeout=0.2)
    finally:
        gate.go.set()
    assert report.stuck_threads == [f"buffer preparation of {nbytes} bytes"]
    assert not report.clean
    for thread in preparers():
        thread.join(10)
    assert preparers() == [] and gate.checks == 2

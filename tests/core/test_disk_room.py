"""The disk budget decided on an estimate of the free space: no ``statvfs`` on the stall while
the estimate is well clear of the budget, the file system read (and the point refused before
any copy) when it comes close, and a point the estimate admitted that then cannot be written
settles ``export_failed``, counted."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
import trio

from actorsys import EvalConfig, EvalSupervisor, MemorySink, staging
from actorsys._core import disk_room
from actorsys._core.disk_room import DISK_HEADROOM_BYTES, DiskRoom
from actorsys.runtime import ThreadTracker
from actorsys.snapshot._write import write as _write
from tests.fakes import RecordingEval, tiny_state_dict

GiB = 1024**3


class Disk:
    """What ``staging.free_bytes`` reports, and how often it was asked."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, free: int) -> None:
        self.free = free
        self.reads = 0
        monkeypatch.setattr(staging, "free_bytes", self.free_bytes)

    def free_bytes(self, path: str) -> int:
        self.reads += 1
        return self.free


def room_on(tmp_path: Path, pending: int = 0) -> DiskRoom:
    room = DiskRoom(str(tmp_path), lambda: pending, ThreadTracker())
    room.stop()  # no reader thread: the test takes the readings
    return room


async def test_a_point_well_clear_of_the_budget_is_admitted_without_reading_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = Disk(monkeypatch, 100 * GiB)
    room = room_on(tmp_path)
    room.read()
    assert disk.reads == 1

    assert await room.has_room(GiB)
    assert await room.has_room(GiB)
    assert disk.reads == 1 and room.exact_reads == 0
    assert room.estimate() == 100 * GiB - 2 * GiB - DISK_HEADROOM_BYTES


async def test_the_estimate_counts_every_admitted_point_until_it_left_the_exporter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = Disk(monkeypatch, 3 * GiB)
    room = room_on(tmp_path)
    room.read()
    assert await room.has_room(GiB)  # 2 GiB left after it, clear of the 1 GiB margin
    assert room.exact_reads == 0
    # The disk has not changed yet (nothing written): the estimate still counts that point, so
    # the next one comes within the margin and the file system is read, exactly.
    assert await room.has_room(GiB)
    assert room.exact_reads == 1
    disk.free = GiB  # both written
    room.read()
    assert room.estimate() == GiB - 2 * GiB - DISK_HEADROOM_BYTES
    room.left(GiB)
    room.left(GiB)
    room.read()
    assert room.estimate() == GiB - DISK_HEADROOM_BYTES


async def test_a_point_that_does_not_fit_is_refused_on_a_fresh_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = Disk(monkeypatch, 100 * GiB)
    room = room_on(tmp_path, pending=GiB)
    room.read()
    disk.free = 2 * GiB  # someone else filled the disk since the reading
    assert not await room.has_room(90 * GiB)  # within the margin: read now, and refused
    assert room.exact_reads == 1
    # The estimate starts from that reading now: too close for another GiB, read again, and
    # refused (2 GiB free, 1 GiB still to be written, the headroom).
    assert not await room.has_room(GiB)
    assert room.exact_reads == 2
    assert room.estimate() == 2 * GiB - DISK_HEADROOM_BYTES  # the last reading; nothing admitted


async def test_a_stale_reading_or_none_is_never_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Disk(monkeypatch, 100 * GiB)
    room = room_on(tmp_path)
    assert room.estimate() is None
    assert await room.has_room(GiB)
    assert room.exact_reads == 1
    room.read()
    monkeypatch.setattr(disk_room, "TRUST_SECONDS", -1.0)
    assert room.estimate() is None
    assert await room.has_room(GiB)
    assert room.exact_reads == 2


async def test_a_disk_that_cannot_be_read_is_no_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    room = room_on(tmp_path / "gone")
    room.read()
    assert room.estimate() is None


@pytest.mark.timeout(60)
async def test_a_point_admitted_on_the_estimate_that_cannot_be_written_is_a_counted_skip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Disk(monkeypatch, 1024 * GiB)

    def disk_full(path: str, tensors: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", path)

    sink = MemorySink()
    config = EvalConfig(hf_dir=tmp_path / "hf")
    async with EvalSupervisor.open(config, eval_fn=RecordingEval(), sink=sink) as sup:
        assert await sup.submit(1, state_dict=tiny_state_dict())
        await sup.drain()
        room = sup._running().admission.disk
        assert room is not None
        await trio.to_thread.run_sync(room.read)
        exact_reads = room.exact_reads
        monkeypatch.setattr(_write, "write_file", disk_full)
        assert await sup.submit(2, state_dict=tiny_state_dict(1))
        assert room.exact_reads == exact_reads  # admitted on the estimate
        await sup.drain()
        statistics = sup.statistics()

    assert sink.by_step()[1].ok
    outcome = sink.by_step()[2]
    assert outcome.reason == "export_failed"
    assert "No space left on device" in outcome.data["error"]
    assert statistics.skipped_by_reason == {"export_failed": 1}

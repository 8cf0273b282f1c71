"""The buffer pool: reused sets, a hard cap, and no reuse while an abandoned writer reads."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest
import torch

from actorsys.runtime import exit_guard
from actorsys.snapshot import BufferPool, WeightsReleasedError, capture, plan_state, write_snapshot
from actorsys.snapshot._pool import memory
from actorsys.snapshot._pool import pool as _pool
from actorsys.snapshot._write import safetensors as _safetensors
from tests.fakes import ChunkGate

from .snapshot_models import tiny_llama


def lease_for(pool: BufferPool, model: torch.nn.Module):  # type: ignore[no-untyped-def]
    plan = plan_state(model)
    lease = pool.try_lease(plan.buffer_nbytes, pinned=plan.on_cuda)
    assert lease is not None
    return lease


def test_copies_reuse_the_same_buffers_across_captures():
    model = tiny_llama()
    pool = BufferPool(2)
    pointers = set()

    for _ in range(5):
        weights = capture(model, buffers=lease_for(pool, model))
        pointers.add(next(iter(weights.tensors.values())).data_ptr())
        weights.release()

    assert len(pointers) == 1
    stats = pool.statistics()
    assert (stats.leases, stats.allocations, stats.sets, stats.free) == (5, 1, 1, 1)


def test_pool_never_holds_more_than_max_sets():
    pool = BufferPool(2)
    first = pool.try_lease(1024, pinned=False)
    second = pool.try_lease(1024, pinned=False)
    assert first is not None
    assert second is not None

    assert pool.try_lease(1024, pinned=False) is None
    first.give_back()
    assert pool.try_lease(1024, pinned=False) is not None


def test_a_set_too_small_for_a_grown_model_is_replaced_not_added():
    pool = BufferPool(1)
    small = pool.try_lease(1024, pinned=False)
    assert small is not None
    small.buffer()
    small.give_back()

    big = pool.try_lease(4096, pinned=False)
    assert big is not None
    assert big.buffer().numel() == 4096
    big.give_back()
    stats = pool.statistics()
    assert (stats.sets, stats.allocations, stats.free_nbytes) == (1, 2, 4096)


def test_buffers_a_writer_still_reads_go_back_only_when_it_stops():
    model = tiny_llama()
    freed = []
    pool = BufferPool(1, on_free=lambda: freed.append(True))
    weights = capture(model, buffers=lease_for(pool, model))

    with weights.reading():
        weights.release()
        assert pool.try_lease(1024, pinned=False) is None
        assert freed == []
        assert weights.tensors
    assert freed == [True]
    assert weights.tensors == {}
    assert pool.try_lease(1024, pinned=False) is not None


def test_a_write_started_after_release_leaves_nothing(tmp_path):
    weights = capture(tiny_llama())
    weights.release()
    directory = tmp_path / "snap"
    directory.mkdir()

    with pytest.raises(WeightsReleasedError):
        write_snapshot(weights, str(directory))
    assert not directory.exists()


def test_a_write_abandoned_midway_stops_at_the_next_chunk_and_removes_its_dir(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(_safetensors, "CHUNK_BYTES", 1024)
    model = tiny_llama()
    pool = BufferPool(1)
    weights = capture(model, buffers=lease_for(pool, model))
    checks = 0
    check_live = weights.check_live

    def release_on_third_chunk() -> None:
        nonlocal checks
        checks += 1
        if checks == 3:
            weights.release()
        check_live()

    monkeypatch.setattr(weights, "check_live", release_on_third_chunk)
    directory = tmp_path / "snap"
    directory.mkdir()

    with pytest.raises(WeightsReleasedError):
        write_snapshot(weights, str(directory))

    assert checks == 3
    assert not os.path.exists(directory)
    assert pool.statistics().free == 1


def test_a_failed_copy_gives_its_lease_back():
    pool = BufferPool(1)
    lease = pool.try_lease(64, pinned=False)
    assert lease is not None

    with pytest.raises(ValueError, match="lease holds 64"):
        capture(tiny_llama(), buffers=lease)
    assert pool.try_lease(64, pinned=False) is not None


def test_prepare_faults_in_every_set_before_any_copy_and_the_copy_reuses_them():
    model = tiny_llama()
    plan = plan_state(model)
    pool = BufferPool(2)

    assert pool.prepare(plan.buffer_nbytes, pinned=False) == 2
    stats = pool.statistics()
    assert (stats.sets, stats.free, stats.prepared, stats.allocations) == (2, 2, 2, 0)
    prepared = {b.data_ptr() for b in pool._free}

    weights = capture(model, buffers=lease_for(pool, model))
    assert pool.statistics().allocations == 0
    assert next(iter(weights.tensors.values())).data_ptr() in prepared
    weights.release()
    assert pool.prepare(plan.buffer_nbytes, pinned=False) == 0


def test_prepare_replaces_idle_sets_too_small_for_the_weights():
    pool = BufferPool(2)
    small = pool.try_lease(1024, pinned=False)
    assert small is not None
    small.buffer()
    small.give_back()

    assert pool.prepare(4096, pinned=False) == 2
    stats = pool.statistics()
    assert (stats.sets, stats.free, stats.free_nbytes) == (2, 2, 2 * 4096)


class HeldPreparation:
    """``allocate_faulted`` that waits for the test to let it finish."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        real = _pool.allocate_faulted

        def held(
            nbytes: int, *, pinned: bool, stopped: Callable[[], bool] | None = None
        ) -> torch.Tensor | None:
            self.entered.set()
            assert self.release.wait(10)
            return real(nbytes, pinned=pinned, stopped=stopped)

        monkeypatch.setattr(_pool, "allocate_faulted", held)


@pytest.mark.timeout(20)
def test_a_lease_takes_a_set_still_being_prepared_and_its_copy_waits_for_it(monkeypatch):
    model = tiny_llama()
    plan = plan_state(model)
    held = HeldPreparation(monkeypatch)
    pool = BufferPool(1)
    preparing = threading.Thread(target=pool.prepare, args=(plan.buffer_nbytes,),
                                 kwargs={"pinned": False})
    preparing.start()
    assert held.entered.wait(10)
    assert pool.statistics().preparing == 1

    lease = lease_for(pool, model)
    copied = []
    copying = threading.Thread(target=lambda: copied.append(capture(model, buffers=lease)))
    copying.start()
    held.release.set()
    copying.join(10)
    preparing.join(10)

    stats = pool.statistics()
    assert (stats.sets, stats.prepared, stats.allocations, stats.preparing) == (1, 1, 0, 0)
    copied[0].release()
    assert pool.statistics().free == 1


@pytest.mark.timeout(20)
def test_a_lease_given_back_before_its_set_is_prepared_leaves_the_set_to_the_pool(monkeypatch):
    held = HeldPreparation(monkeypatch)
    freed = []
    pool = BufferPool(1, on_free=lambda: freed.append(True))
    preparing = threading.Thread(target=pool.prepare, args=(4096,), kwargs={"pinned": False})
    preparing.start()
    assert held.entered.wait(10)
    lease = pool.try_lease(4096, pinned=False)
    assert lease is not None

    lease.give_back()
    held.release.set()
    preparing.join(10)

    stats = pool.statistics()
    assert (stats.sets, stats.free, stats.prepared, stats.allocations) == (1, 1, 1, 0)
    assert freed == [True]


@pytest.mark.timeout(20)
def test_the_first_copy_prepares_the_other_sets_in_the_background():
    model = tiny_llama()
    pool = BufferPool(3, prepare_spares=True)

    first = capture(model, buffers=lease_for(pool, model))
    pool.wait_prepared()

    stats = pool.statistics()
    assert (stats.sets, stats.free, stats.prepared, stats.allocations) == (3, 2, 2, 1)
    second = capture(model, buffers=lease_for(pool, model))
    third = capture(model, buffers=lease_for(pool, model))
    assert pool.statistics().allocations == 1
    for weights in (first, second, third):
        weights.release()
    assert pool.prepare_spares(plan_state(model).buffer_nbytes, pinned=False) is None


def test_a_pool_without_spares_prepares_nothing_on_its_own():
    model = tiny_llama()
    pool = BufferPool(2)

    capture(model, buffers=lease_for(pool, model)).release()
    pool.wait_prepared()

    assert pool.statistics().prepared == 0


def test_a_set_keeps_its_views_for_an_unchanged_model_and_copies_its_values_as_they_are():
    model = tiny_llama(tied=False)
    pool = BufferPool(1)
    first = capture(model, buffers=lease_for(pool, model))
    head = first.tensors["lm_head.weight"]
    first.release()
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)

    second = capture(model, buffers=lease_for(pool, model))
    try:
        assert second.tensors["lm_head.weight"] is head
        assert torch.equal(second.tensors["lm_head.weight"], model.lm_head.weight)
    finally:
        second.release()

    model.lm_head.weight = torch.nn.Parameter(torch.ones(model.lm_head.weight.shape[0] + 3, 64))
    third = capture(model, buffers=lease_for(pool, model))
    try:
        assert third.tensors["lm_head.weight"] is not head
        assert torch.equal(third.tensors["lm_head.weight"], model.lm_head.weight)
        for name, tensor in model.state_dict().items():
            assert torch.equal(third.tensors[name], tensor), name
    finally:
        third.release()


def test_a_set_the_pool_lets_go_is_freed_with_the_views_it_kept():
    from torch.multiprocessing.reductions import StorageWeakRef

    model = tiny_llama(tied=False)
    pool = BufferPool(1)
    lease = lease_for(pool, model)
    freed = [StorageWeakRef(lease.buffer().untyped_storage())]
    capture(model, buffers=lease).release()
    grown = pool.try_lease(pool.statistics().free_nbytes + 1, pinned=False)
    assert grown is not None
    freed.append(StorageWeakRef(grown.buffer().untyped_storage()))
    capture(model, buffers=grown).release()
    del lease, grown
    assert [ref.expired() for ref in freed] == [True, False]  # the small set was replaced
    pool.close()
    assert [ref.expired() for ref in freed] == [True, True]


def test_faulting_in_asks_before_each_chunk_whether_to_stop(monkeypatch):
    monkeypatch.setattr(memory, "FAULT_CHUNK_BYTES", 1024)
    asked = []

    def stopped() -> bool:
        asked.append(True)
        return len(asked) > 2  # two chunks, then stop

    assert memory.allocate_faulted(4 * 1024 + 1, pinned=False, stopped=stopped) is None
    assert len(asked) == 3
    whole = memory.allocate_faulted(4 * 1024 + 1, pinned=False, stopped=lambda: False)
    assert whole is not None and whole.numel() == 4 * 1024 + 1 and not whole.any()


@pytest.mark.timeout(30)
def test_close_stops_a_preparation_between_chunks_and_joins_its_thread(monkeypatch):
    monkeypatch.setattr(memory, "FAULT_CHUNK_BYTES", 1024)
    gate = ChunkGate(monkeypatch, at=2)
    pool = BufferPool(2, prepare_spares=True)
    thread = pool.prepare_spares(8 * 1024, pinned=False)
    assert thread is not None
    assert gate.waiting.wait(10)  # one chunk zeroed; the question before the second waits
    described = "buffer preparation of 8192 bytes"
    assert described in exit_guard.running()

    assert pool.close() is False  # never blocks: the preparation is stopped, not yet done
    assert pool.unfinished() == [described]
    gate.go.set()
    assert pool.close(timeout=10) is True

    assert not thread.is_alive()
    assert gate.checks == 2  # no chunk zeroed after the close, no other set started
    assert pool.unfinished() == []
    stats = pool.statistics()
    assert (stats.sets, stats.prepared, stats.preparing, stats.free) == (0, 0, 0, 0)
    assert described not in exit_guard.running()
    assert pool.prepare_spares(8 * 1024, pinned=False) is None


@pytest.mark.timeout(30)
def test_a_lease_of_a_stopped_preparation_copies_into_memory_of_its_own(monkeypatch):
    model = tiny_llama()
    plan = plan_state(model)
    gate = ChunkGate(monkeypatch, at=1)
    pool = BufferPool(1)
    preparing = threading.Thread(target=pool.prepare, args=(plan.buffer_nbytes,),
                                 kwargs={"pinned": False})
    preparing.start()
    assert gate.waiting.wait(10)
    lease = lease_for(pool, model)  # takes the set being prepared

    assert pool.close() is False
    gate.go.set()
    preparing.join(10)
    weights = capture(model, buffers=lease)
    try:
        state = model.state_dict()
        assert weights.tensors
        for name, tensor in weights.tensors.items():
            assert torch.equal(tensor, state[name]), name
    finally:
        weights.release()
    assert pool.statistics().sets == 0

"""Getting ready for the first point: ``prepare`` plans the weights, learns their conversions
and faults the buffer sets in; the first submit then reuses them. Real models, real exports;
observed through the pool's statistics and the threads transformers is asked on."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator

import pytest
import torch
import transformers.conversion_mapping as conversion_mapping
import trio

from actorsys import CheckpointEvalFn, ConfigError, EvalConfig, EvalSupervisor, MemorySink
from actorsys.contracts import RolloutFnEvalInput, RolloutFnEvalOutput
from actorsys.snapshot import (
    BufferPool,
    PoolStatistics,
    _conversions,
    capture,
    plan_state,
    prepare_like_checkpoint,
    write_snapshot,
)
from actorsys.snapshot._pool.prepare import checkpoint_buffer_nbytes
from bridge import AsyncEvalBridge, EvalBridge

from .snapshot_models import tiny_llama, tiny_mixtral


class ListFiles(CheckpointEvalFn):
    async def evaluate_checkpoint(
        self, checkpoint_dir: str, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        return RolloutFnEvalOutput(data={"files": sorted(os.listdir(checkpoint_dir))})


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The threads transformers' conversion lookup runs on, from an empty cache."""
    threads: list[int] = []
    real = conversion_mapping.get_model_conversion_mapping

    def recorded(*args: object, **kwargs: object) -> object:
        threads.append(threading.get_ident())
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(conversion_mapping, "get_model_conversion_mapping", recorded)
    _conversions.forget()
    yield threads
    _conversions.forget()


def same_files(ours: str, theirs: str) -> bool:
    names = sorted(os.listdir(theirs))
    if sorted(os.listdir(ours)) != names:
        return False
    for name in names:
        with open(os.path.join(ours, name), "rb") as a, open(os.path.join(theirs, name), "rb") as b:
            if a.read() != b.read():
                return False
    return True


def write_in_a_thread(weights: object, directory: str) -> None:
    os.makedirs(directory)
    writer = threading.Thread(target=write_snapshot, args=(weights, directory))
    writer.start()
    writer.join(60)


@pytest.mark.timeout(60)
def test_conversions_are_looked_up_in_the_writing_thread_never_the_capturing_one(
    tmp_path, lookups
):
    model = tiny_mixtral()
    theirs = str(tmp_path / "theirs")
    model.save_pretrained(theirs)
    lookups.clear()

    first = capture(model)
    assert lookups == [] and first.converter is None
    write_in_a_thread(first, str(tmp_path / "first"))
    assert lookups and threading.get_ident() not in lookups
    first.release()
    lookups.clear()

    second = capture(model)
    assert second.converter is model and lookups == []
    write_in_a_thread(second, str(tmp_path / "second"))
    second.release()
    assert same_files(str(tmp_path / "first"), theirs)
    assert same_files(str(tmp_path / "second"), theirs)


def config(tmp_path: object) -> EvalConfig:
    return EvalConfig(hf_dir=os.path.join(str(tmp_path), "hf"), max_in_flight=2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
async def test_prepare_faults_in_every_set_and_the_first_submit_copies_into_one(tmp_path, tied):
    model = tiny_llama(tied=tied)
    sink = MemorySink()
    async with EvalSupervisor.open(config(tmp_path), eval_fn=ListFiles(), sink=sink) as sup:
        prepared = await sup.prepare(model=model)
        assert (prepared.sets, prepared.free, prepared.prepared, prepared.allocations) == (
            2, 2, 2, 0,
        )

        assert await sup.submit(0, model=model)
        assert await sup.submit(1, model=model)
        await sup.drain()

        stats = sup.statistics().buffers
        assert stats is not None
        assert (stats.leases, stats.allocations, stats.prepared, stats.sets) == (2, 0, 2, 2)
    assert [o.ok for o in sink.outcomes] == [True, True]


@pytest.mark.timeout(60)
async def test_after_prepare_a_submit_never_asks_transformers_on_the_trio_thread(tmp_path, lookups):
    model = tiny_mixtral()
    async with EvalSupervisor.open(config(tmp_path), eval_fn=ListFiles()) as sup:
        await sup.prepare(model=model)
        assert lookups and threading.get_ident() not in lookups
        assert _conversions.known(model) is True
        lookups.clear()

        assert await sup.submit(0, model=model)
        await sup.drain()
    assert threading.get_ident() not in lookups


@pytest.mark.timeout(60)
async def test_a_submit_without_prepare_leaves_the_lookup_to_the_export_thread(tmp_path, lookups):
    model = tiny_mixtral()
    sink = MemorySink()
    async with EvalSupervisor.open(config(tmp_path), eval_fn=ListFiles(), sink=sink) as sup:
        assert await sup.submit(0, model=model)
        assert threading.get_ident() not in lookups
        await sup.drain()
    assert lookups and threading.get_ident() not in lookups
    assert _conversions.known(model) is True
    assert sink.outcomes[0].ok


@pytest.mark.timeout(60)
async def test_prepare_refuses_bad_arguments_naming_them(tmp_path):
    model = tiny_llama()
    async with EvalSupervisor.open(config(tmp_path), eval_fn=ListFiles()) as sup:
        with pytest.raises(ConfigError, match="exactly one"):
            await sup.prepare()
        with pytest.raises(ConfigError, match="exactly one"):
            await sup.prepare(model=model, state_dict=model.state_dict())
        with pytest.raises(ConfigError) as caught:
            await sup.prepare(model="model")  # type: ignore[arg-type]
        assert caught.value.field == "model"
        with pytest.raises(ConfigError) as caught:
            await sup.prepare(state_dict={"w": [1.0]})  # type: ignore[dict-item]
        assert caught.value.field == "state_dict"
        assert sup.statistics().buffers == PoolStatistics(
            sets=0, free=0, leases=0, allocations=0, free_nbytes=0
        )


@pytest.mark.timeout(60)
def test_the_bridge_prepares_before_the_first_submit(tmp_path):
    model = tiny_llama(dtype=torch.bfloat16)
    with EvalBridge(config(tmp_path), eval_fn=ListFiles()) as bridge:
        prepared = bridge.prepare(state_dict=model.state_dict())
        assert prepared is not None and (prepared.prepared, prepared.free) == (2, 2)
        assert bridge.submit(0, state_dict=model.state_dict())
        bridge.drain()
    stats = bridge.statistics().buffers
    assert stats is not None
    assert (stats.leases, stats.allocations, stats.prepared) == (1, 0, 2)
    assert bridge.sink.outcomes[0].ok  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
def test_the_asyncio_bridge_prepares_before_the_first_submit(tmp_path):
    model = tiny_llama()

    async def host() -> None:
        async with AsyncEvalBridge(config(tmp_path), eval_fn=ListFiles()) as bridge:
            prepared = await bridge.prepare(model=model)
            assert prepared is not None and prepared.prepared == 2
            assert await bridge.submit(0, model=model)
            await bridge.drain()
        stats = bridge.statistics().buffers
        assert stats is not None
        assert (stats.leases, stats.allocations, stats.prepared) == (1, 0, 2)

    asyncio.run(host())


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("tied", "dtype"), [(True, torch.float32), (False, torch.bfloat16)], ids=["tied", "untied-bf16"]
)
async def test_a_base_checkpoint_sizes_the_buffers_before_the_first_submit(tmp_path, tied, dtype):
    model = tiny_llama(tied=tied, dtype=dtype)
    base = tmp_path / "base"
    model.save_pretrained(base)
    plan = plan_state(model)
    assert checkpoint_buffer_nbytes(str(base)) == plan.buffer_nbytes

    pool = BufferPool(2)
    await trio.to_thread.run_sync(prepare_like_checkpoint(pool, str(base)).join)
    await trio.to_thread.run_sync(pool.wait_prepared)
    stats = pool.statistics()
    assert (stats.sets, stats.free, stats.prepared, stats.allocations) == (2, 2, 2, 0)
    lease = pool.try_lease(plan.buffer_nbytes, pinned=False)
    assert lease is not None and not lease.fresh


async def test_a_base_checkpoint_without_weights_prepares_nothing(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "broken.safetensors").write_bytes(b"\x01")
    assert checkpoint_buffer_nbytes(str(tmp_path)) is None
    # A length claiming exabytes is refused without allocating them.
    (tmp_path / "broken.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    assert checkpoint_buffer_nbytes(str(tmp_path)) is None
    pool = BufferPool(2)
    await trio.to_thread.run_sync(prepare_like_checkpoint(pool, str(tmp_path)).join)
    assert pool.statistics().sets == 0

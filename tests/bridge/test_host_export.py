"""An asyncio host's ``export=`` runs on the host's own loop, and the supervisor's export
deadline cancels it there."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from actorsys import (
    CheckpointEvalFn,
    EvalConfig,
    MemorySink,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from bridge import AsyncEvalBridge


class ReadShards(CheckpointEvalFn):
    runtime = "thread"

    def evaluate_checkpoint(
        self, checkpoint_dir: str, eval_input: RolloutFnEvalInput
    ) -> RolloutFnEvalOutput:
        shards = sorted(n for n in os.listdir(checkpoint_dir) if n.endswith(".safetensors"))
        total = sum(float(load_file(os.path.join(checkpoint_dir, n))["w"].sum()) for n in shards)
        return RolloutFnEvalOutput(data={"shards": shards}, metrics={"eval/sum": total})


@pytest.mark.timeout(30)
def test_an_asyncio_export_runs_on_the_hosts_loop_and_its_shards_are_published(
    tmp_path: Path,
) -> None:
    seen: list[tuple[asyncio.AbstractEventLoop, str]] = []

    async def write_shard(path: str, rank: int, step: int) -> None:
        await asyncio.sleep(0.01)
        save_file({"w": torch.full((4,), float(step))}, f"{path}/shard-{rank}.safetensors")

    async def export(step: int, path: str) -> None:
        seen.append((asyncio.get_running_loop(), threading.current_thread().name))
        await asyncio.gather(*(write_shard(path, rank, step) for rank in range(2)))

    async def host() -> asyncio.AbstractEventLoop:
        config = EvalConfig(hf_dir=tmp_path / "staging", export_timeout=20)
        async with AsyncEvalBridge(config, eval_fn=ReadShards(), sink=MemorySink()) as bridge:
            for step in (1, 2):
                assert await bridge.submit(step, export=export)
            assert (await bridge.drain(timeout=20)).pending == []
            outcomes = bridge.sink.outcomes  # type: ignore[attr-defined]
        assert [(o.step, o.status, o.metrics["eval/sum"]) for o in outcomes] == [
            (1, "ok", 8.0), (2, "ok", 16.0),
        ]
        assert outcomes[1].data["shards"] == ["shard-0.safetensors", "shard-1.safetensors"]
        return asyncio.get_running_loop()

    loop = asyncio.run(host())
    assert seen == [(loop, threading.main_thread().name)] * 2


@pytest.mark.timeout(30)
def test_an_asyncio_export_past_its_deadline_is_cancelled_on_the_hosts_loop(
    tmp_path: Path,
) -> None:
    cancelled = asyncio.Event()

    async def export(step: int, path: str) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def host() -> None:
        config = EvalConfig(hf_dir=tmp_path / "staging", export_timeout=0.5)
        sink = MemorySink()
        async with AsyncEvalBridge(config, eval_fn=ReadShards(), sink=sink) as bridge:
            assert await bridge.submit(1, export=export)
            await asyncio.wait_for(cancelled.wait(), timeout=20)
            assert (await bridge.drain(timeout=20)).pending == []
        assert [(o.step, o.reason) for o in sink.outcomes] == [(1, "export_timeout")]
        assert sorted(os.listdir(tmp_path / "staging")) == ["journal.jsonl"]

    asyncio.run(host())

"""Shared mode on real CPU engine processes: a test trainer updates the engines' weights the
way a disk-syncing trainer does (``/update_weights_from_disk`` with its version, inside
``weight_update``), rollouts run on the engine from a thread the whole time, and the
evaluations are scored on exactly the weights the trainer loaded. Wall-clock bound."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from actorsys import (
    EvalConfig,
    EvalSupervisor,
    MemorySink,
)
from actorsys.evals import DatasetEval, EvalDataset, ServerEvalFn
from actorsys.fleet import Fleet, SGLangEngine
from actorsys.fleet.local import new_api_key
from bridge import EvalBridge
from tests.engine_process import engine_processes
from tests.fleet.conftest import TinyModels
from tests.fleet.pipeline import MAX_TOKENS, ServedGreedy
from tests.fleet.rollouts import Rollouts
from tests.models import PROMPTS, greedy, make_snapshot

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fleet/test_shared_fleet")]

class Engines:
    def __init__(self, urls: list[str], key: str) -> None:
        self.urls = urls
        self.key = key

    def clients(self, count: int) -> list[SGLangEngine]:
        return [SGLangEngine(url, name=f"rollout-{i}", api_key=self.key)
                for i, url in enumerate(self.urls[:count])]


@pytest.fixture(scope="module")
def engines(tiny: TinyModels) -> Iterator[Engines]:
    key = new_api_key()
    with engine_processes([["--model", str(tiny.base)]] * 3, key=key) as urls:
        yield Engines(urls, key)


ROLLOUT = {"prompt": "rollout", "max_tokens": 8, "temperature": 1.0}


def snapshots(tiny: TinyModels, root: Path, steps: list[int]) -> dict[int, Path]:
    """What the trainer saves at each step (other random weights of the base's architecture)."""
    saved = {}
    for step in steps:
        make_snapshot(tiny.base, root / f"trainer_step_{step}", seed=500 + step)
        saved[step] = root / f"trainer_step_{step}"
    return saved


@pytest.mark.timeout(600)
async def test_served_points_score_exactly_the_weights_the_trainer_loaded_while_rollouts_run(
    engines: Engines, tiny: TinyModels, tmp_path: Path
) -> None:
    (engine,) = engines.clients(1)
    saved = await trio.to_thread.run_sync(snapshots, tiny, tmp_path, [1, 2, 3])
    sink = MemorySink()
    config = EvalConfig(base_checkpoint=tiny.base, pin_timeout=60.0, eval_timeout=120.0)
    with Rollouts(engines.urls[0], engines.key, ROLLOUT) as rollouts:
        async with EvalSupervisor.open(
            config, eval_fn=ServedGreedy(), fleet=Fleet([engine], shared=True), sink=sink
        ) as sup:
            for step, path in saved.items():
                async with sup.weight_update():
                    await engine.load_weights(str(path), str(step))  # the trainer's sync
                await sup.submit(step, served=True)
            report = await sup.drain(timeout=300)
            waits = sup.statistics().weight_update_waits
    assert report.pending == []
    assert not rollouts.failures and rollouts.done
    assert waits >= 1  # an update waited for the point before it
    by_step = sink.by_step()
    for step, path in saved.items():
        outcome = by_step[step]
        assert outcome.status == "ok", (outcome.reason, outcome.data)
        assert outcome.snapshot is None and outcome.weight_version == str(step)
        expected = await trio.to_thread.run_sync(greedy, path, PROMPTS, MAX_TOKENS)
        assert outcome.data["texts"] == expected


@pytest.mark.timeout(600)
async def test_a_liar_among_honest_shared_engines_is_caught_by_their_agreement(
    engines: Engines, tiny: TinyModels, tmp_path: Path
) -> None:
    clients = engines.clients(3)
    saved = await trio.to_thread.run_sync(snapshots, tiny, tmp_path, [10, 11])
    sink = MemorySink()
    config = EvalConfig(base_checkpoint=tiny.base, pin_timeout=60.0, eval_timeout=120.0)
    async with EvalSupervisor.open(
        config, eval_fn=ServedGreedy(), fleet=Fleet(clients, shared=True), sink=sink
    ) as sup:
        async with sup.weight_update():
            for client in clients[:2]:
                await client.load_weights(str(saved[10]), "10")
            await clients[2].load_weights(str(saved[11]), "10")  # other weights, same label
        await sup.submit(10, served=True)
        await sup.drain(timeout=300)
        async with sup.weight_update():
            await clients[2].load_weights(str(saved[10]), "10")
        await sup.submit(12, served="10")
        await sup.drain(timeout=300)
    lied, honest = sink.by_step()[10], sink.by_step()[12]
    assert (lied.status, lied.reason) == ("skipped", "pin_violation")
    assert "'rollout-2' answer the probe unlike the majority" in lied.data["error"]
    assert honest.status == "ok", (honest.reason, honest.data)


@pytest.mark.timeout(600)
async def test_dataset_and_server_evals_run_on_a_served_point(
    engines: Engines, tiny: TinyModels, tmp_path: Path
) -> None:
    (engine,) = engines.clients(1)
    (saved,) = (await trio.to_thread.run_sync(snapshots, tiny, tmp_path, [20])).values()
    data = tmp_path / "set.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "label": "x"}) + "\n" for p in PROMPTS))
    dataset = EvalDataset.from_jsonl(data, name="set", max_tokens=MAX_TOKENS)
    expected = await trio.to_thread.run_sync(greedy, saved, PROMPTS, MAX_TOKENS)
    config = EvalConfig(base_checkpoint=tiny.base, pin_timeout=60.0, eval_timeout=120.0)
    server = ServerEvalFn([dataset], url=engines.urls[0], api_key=engines.key, pin_timeout=60.0)
    for eval_fn in (DatasetEval([dataset]), server):
        sink = MemorySink()
        async with EvalSupervisor.open(
            config, eval_fn=eval_fn, fleet=Fleet([engine], shared=True), sink=sink
        ) as sup:
            async with sup.weight_update():
                await engine.load_weights(str(saved), "20")
            await sup.submit(20, served=True)
            await sup.drain(timeout=300)
        (outcome,) = sink.outcomes
        assert outcome.status == "ok", (type(eval_fn).__name__, outcome.reason, outcome.data)
        answers = [s["answer"] for s in outcome.data["samples"]["set"]]
        assert answers == expected, type(eval_fn).__name__


@pytest.mark.timeout(600)
def test_the_sync_bridge_gates_updates_while_rollouts_go_on(
    engines: Engines, tiny: TinyModels, tmp_path: Path
) -> None:
    (engine,) = engines.clients(1)
    saved = snapshots(tiny, tmp_path, [30, 31])
    sink = MemorySink()
    config = EvalConfig(base_checkpoint=tiny.base, pin_timeout=60.0, eval_timeout=120.0,
                        shared_update="preempt")
    with Rollouts(engines.urls[0], engines.key, ROLLOUT) as rollouts, EvalBridge(
        config, eval_fn=ServedGreedy(), fleet=Fleet([engine], shared=True), sink=sink
    ) as ev:
        for step, path in saved.items():
            with ev.weight_update():
                trio.run(engine.load_weights, str(path), str(step))
            assert ev.submit(step, served=True)
        ev.drain(timeout=300)
    assert not rollouts.failures and rollouts.done
    outcomes = sink.by_step()
    # under "preempt" step 30 may be cut by the next update (preempted / superseded), never
    # scored on step 31's weights; the last point is always evaluated
    assert outcomes[30].status == "ok" or outcomes[30].reason in ("preempted", "superseded")
    assert outcomes[31].status == "ok", (outcomes[31].reason, outcomes[31].data)
    expected = greedy(saved[31], PROMPTS, MAX_TOKENS)
    assert outcomes[31].data["texts"] == expected

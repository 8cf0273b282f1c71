"""RayFleet across the nodes of the Ray tests' local multi-node cluster (``ray_cluster``:
three raylets on this machine, each with its own resources): engines spread one per node by
the placement strategy the caller chooses, each pinned; a node removed mid-run pins its
engine ``unhealthy`` while the others keep scoring, and the engine Ray places on a new node is
pinned at the next point; ``RayFleet.from_args`` places one engine per
``--eval-num-gpus-per-engine`` GPUs declared. Wall-clock bound: each test has a timeout."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import trio

ray = pytest.importorskip("ray")

from actorsys import (  # noqa: E402
    CheckpointEvalFn,
    EvalConfig,
    EvalSupervisor,
    Fleet,
    MemorySink,
    Outcome,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from actorsys.fleet.ray import RayFleet, await_ref  # noqa: E402
from tests.fleet.conftest import TinyModels  # noqa: E402
from tests.fleet.ray_cluster import RAY_TIER, SLOT, add_node  # noqa: E402
from tests.models import PROMPTS  # noqa: E402

pytestmark = RAY_TIER


class ServedBy(CheckpointEvalFn):
    """Completes one prompt on the pinned fleet; records which engine answered."""

    async def evaluate_checkpoint(
        self, checkpoint_dir: str, input: RolloutFnEvalInput
    ) -> RolloutFnEvalOutput:
        answers = await input.fleet.complete(PROMPTS[:1], max_tokens=4, request_timeout=30.0)
        return RolloutFnEvalOutput(
            data={"engines": [engine.name for engine in input.fleet.engines],
                  "versions": [a.weight_version for a in answers]},
            metrics={"eval/answered": float(len(answers))},
        )


def supervisor(tiny: TinyModels, tmp_path: Path, fleet: Any, sink: MemorySink) -> Any:
    config = EvalConfig(hf_dir=tmp_path / "staging", base_checkpoint=tiny.base, pin_timeout=60.0,
                        eval_timeout=60.0, close_timeout=10.0)
    return EvalSupervisor.open(config, eval_fn=ServedBy(), fleet=fleet, sink=sink)


async def point(sup: Any, sink: MemorySink, tiny: TinyModels, step: int) -> Outcome:
    await sup.submit(step, checkpoint_dir=tiny.step1 if step % 2 else tiny.step2)
    assert (await sup.drain(timeout=120)).pending == []
    return sink.by_step()[step]


async def node_of(actor: Any) -> str:
    return str(await await_ref(actor.node_id.remote()))


def alive_nodes() -> dict[str, Any]:
    return {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}


@pytest.mark.timeout(300)
async def test_spread_places_one_engine_per_node_and_every_engine_is_pinned(
    ray_cluster: Any, tiny: TinyModels, tmp_path: Path
) -> None:
    resources = {"num_cpus": 1, "scheduling_strategy": "SPREAD"}
    async with RayFleet.open(tiny.base, num_engines=3, resources=resources) as ray_fleet:
        nodes = [await node_of(actor) for actor in ray_fleet.actors]
        assert len(set(nodes)) == 3 and set(nodes) <= set(alive_nodes())
        sink = MemorySink()
        async with supervisor(tiny, tmp_path, ray_fleet.fleet, sink) as sup:
            outcome = await point(sup, sink, tiny, 1)
            # The pin loaded the snapshot into every engine and read its version back.
            versions = [await engine.weight_version() for engine in ray_fleet.engines]
    assert outcome.status == "ok", (outcome.reason, outcome.data)
    assert outcome.data["engines"] == [e.name for e in ray_fleet.engines]
    assert versions == ["1"] * 3


@pytest.mark.timeout(420)
async def test_a_removed_node_pins_unhealthy_the_others_score_and_its_replacement_is_pinned(
    ray_cluster: Any, tiny: TinyModels, tmp_path: Path
) -> None:
    cluster = ray_cluster
    resources = {"num_cpus": 1, "resources": {SLOT: 1}, "scheduling_strategy": "SPREAD"}
    async with RayFleet.open(
        tiny.base, num_engines=3, resources=resources, max_restarts=1
    ) as ray_fleet:
        nodes = [await node_of(actor) for actor in ray_fleet.actors]
        victim_index = next(i for i, n in enumerate(nodes) if n != cluster.head_node.node_id)
        victim = ray_fleet.engines[victim_index]
        victim.answer_timeout = 3.0
        # One fleet per engine: a lost engine fails only the points pinned to its fleet.
        fleets = [Fleet([engine]) for engine in ray_fleet.engines]
        sink = MemorySink()
        async with supervisor(tiny, tmp_path, fleets, sink) as sup:
            assert [(await point(sup, sink, tiny, s)).status for s in (1, 2, 3)] == ["ok"] * 3

            node = next(n for n in cluster.worker_nodes if n.node_id == nodes[victim_index])
            await trio.to_thread.run_sync(cluster.remove_node, node)
            # The fleets take points in turn: three points reach each fleet once.
            lost = [await point(sup, sink, tiny, s) for s in (4, 5, 6)]
            assert sorted((o.status, o.reason) for o in lost) == [
                ("ok", None), ("ok", None), ("skipped", "unhealthy")]
            assert victim.name not in {o.data["engines"][0] for o in lost if o.ok}

            # Ray starts a node only from the main thread (signal handlers): it blocks trio
            # for that while, with no point in flight.
            replacement = add_node(cluster, num_cpus=2, resources={SLOT: 1})
            with trio.fail_after(180):
                while True:
                    try:
                        await victim.health()
                        break
                    except Exception:
                        await trio.sleep(0.5)
            assert await node_of(ray_fleet.actors[victim_index]) == replacement.node_id
            again = [await point(sup, sink, tiny, s) for s in (7, 8, 9)]
    assert [o.status for o in again] == ["ok"] * 3
    assert victim.name in {o.data["engines"][0] for o in again}


def fleet_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    EvalConfig.add_arguments(parser)
    return parser.parse_args(list(argv))


async def placed_gpus(ray_fleet: RayFleet) -> list[list[str]]:
    """The GPUs each engine server sees (``CUDA_VISIBLE_DEVICES``, as Ray set it), sorted."""
    placed = []
    for actor in ray_fleet.actors:
        _, server_pid = await await_ref(actor.pids.remote())
        environ = Path(f"/proc/{server_pid}/environ").read_bytes().split(b"\0")
        visible = next(v for v in environ if v.startswith(b"CUDA_VISIBLE_DEVICES="))
        placed.append(sorted(visible.decode().split("=")[1].split(",")))
    return sorted(placed)


@pytest.mark.timeout(300)
async def test_from_args_places_one_engine_per_g_declared_gpus_and_the_points_are_ok(
    ray_cluster: Any, tiny: TinyModels, tmp_path: Path
) -> None:
    """Two declared GPUs: one engine of both, then two engines of one each (scored)."""
    gpus = ("--eval-num-gpus", "2", "--eval-num-gpus-per-engine")
    async with RayFleet.from_args(fleet_args(*gpus, "2"), tiny.base) as one:
        assert await placed_gpus(one) == [["0", "1"]]
        assert ray.available_resources().get("GPU", 0) == 0
    async with RayFleet.from_args(fleet_args(*gpus, "1"), tiny.base) as two:
        assert await placed_gpus(two) == [["0"], ["1"]]
        assert ray.available_resources().get("GPU", 0) == 0
        sink = MemorySink()
        async with supervisor(tiny, tmp_path, two.fleet, sink) as sup:
            outcome = await point(sup, sink, tiny, 1)
    assert outcome.status == "ok", (outcome.reason, outcome.data)
    assert outcome.data["versions"] == ["1"]

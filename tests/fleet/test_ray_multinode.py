"""RayFleet across the nodes of a local multi-node Ray cluster (three raylets on this
machine, each with its own resources): engines spread one per node by the placement
strategy the caller chooses; a node removed mid-run pins its engine ``unhealthy`` while the
others keep scoring, and the engine Ray places on a new node is pinned at the next point;
``RayFleet.from_args`` places one engine per ``--eval-num-gpus-per-engine`` GPUs declared.
Wall-clock bound: each test has a timeout."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
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
from tests.fleet.ray_cluster import add_node, local_cluster  # noqa: E402
from tests.models import PROMPTS  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SLOT = "engine_slot"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Head A (2 CPUs, 2 declared GPUs) and workers B and C (2 CPUs), one engine slot each."""
    with local_cluster(
        {"num_cpus": 2, "num_gpus": 2, "resources": {SLOT: 1}},
        {"num_cpus": 2, "resources": {SLOT: 1}},
        {"num_cpus": 2, "resources": {SLOT: 1}},
    ) as running:
        yield running


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
async def test_spread_places_one_engine_per_node_and_every_engine_scores(
    cluster: Any, tiny: TinyModels, tmp_path: Path
) -> None:
    resources = {"num_cpus": 1, "scheduling_strategy": "SPREAD"}
    async with RayFleet.open(tiny.base, num_engines=3, resources=resources) as ray_fleet:
        nodes = [await node_of(actor) for actor in ray_fleet.actors]
        assert len(set(nodes)) == 3 and set(nodes) <= set(alive_nodes())
        fleets = [Fleet([engine]) for engine in ray_fleet.engines]
        sink = MemorySink()
        async with supervisor(tiny, tmp_path, fleets, sink) as sup:
            outcomes = [await point(sup, sink, tiny, step) for step in (1, 2, 3)]
    assert [o.status for o in outcomes] == ["ok"] * 3
    assert sorted(o.data["engines"][0] for o in outcomes) == [e.name for e in ray_fleet.engines]


@pytest.mark.timeout(420)
async def test_a_removed_node_pins_unhealthy_the_others_score_and_its_replacement_is_pinned(
    cluster: Any, tiny: TinyModels, tmp_path: Path
) -> None:
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


async def visible_gpus(actor: Any) -> str:
    _, server_pid = await await_ref(actor.pids.remote())
    environ = Path(f"/proc/{server_pid}/environ").read_bytes().split(b"\0")
    return next(v for v in environ if v.startswith(b"CUDA_VISIBLE_DEVICES=")).decode().split("=")[1]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("per_engine", "expected"), [(1, [["0"], ["1"]]), (2, [["0", "1"]])])
async def test_from_args_places_one_engine_per_g_declared_gpus_and_the_points_are_ok(
    cluster: Any, tiny: TinyModels, tmp_path: Path, per_engine: int, expected: list[list[str]]
) -> None:
    args = fleet_args("--eval-num-gpus", "2", "--eval-num-gpus-per-engine", str(per_engine))
    async with RayFleet.from_args(args, tiny.base) as ray_fleet:
        gpus = sorted([sorted((await visible_gpus(a)).split(",")) for a in ray_fleet.actors])
        assert gpus == expected
        assert ray.available_resources().get("GPU", 0) == 0
        sink = MemorySink()
        async with supervisor(tiny, tmp_path, ray_fleet.fleet, sink) as sup:
            outcome = await point(sup, sink, tiny, 1)
    assert outcome.status == "ok", (outcome.reason, outcome.data)
    assert outcome.data["versions"] == ["1"]

"""Engines as Ray actors on a local cluster (one per module, two CPUs): pinned and evaluated
through EvalSupervisor, a killed actor restarted by Ray and pinned again, a hanging Ray
task cut off at close, and an engine on the node's address that requires the fleet's key.
Wall-clock bound: each test has a timeout."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

ray = pytest.importorskip("ray")

from actorsys import (  # noqa: E402
    CheckpointEvalFn,
    EvalConfig,
    EvalSupervisor,
    MemorySink,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from actorsys.fleet.local import FleetStartError  # noqa: E402
from actorsys.fleet.ray import RayFleet, await_ref  # noqa: E402
from tests.fleet.conftest import TinyModels  # noqa: E402
from tests.fleet.pipeline import assert_pinned, evaluate, pipeline  # noqa: E402
from tests.models import PROMPTS  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ENGINE = {"num_cpus": 0.5}


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[None]:
    ray.init(
        address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
        object_store_memory=80 * 1024 * 1024,
    )
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.timeout(240)
async def test_two_engine_actors_serve_exactly_the_pinned_snapshot(
    tiny: TinyModels, tmp_path: Path
) -> None:
    async with RayFleet.open(tiny.base, num_engines=2, resources=ENGINE) as ray_fleet:
        assert len(ray_fleet.actors) == 2
        async with pipeline(tiny, tmp_path, ray_fleet.fleet) as (sup, sink):
            for step in (1, 2):
                assert_pinned(await evaluate(sup, sink, tiny, step), engines=2)
        assert len(set(ray_fleet.fleet.urls)) == 2


async def gone(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


async def answering(actor: Any) -> None:
    while True:
        try:
            await await_ref(actor.url.remote())
            return
        except ray.exceptions.RayError:
            await trio.sleep(0.25)


@pytest.mark.timeout(240)
async def test_killed_engine_actor_skips_the_point_and_pins_again_once_ray_restarted_it(
    tiny: TinyModels, tmp_path: Path
) -> None:
    async with RayFleet.open(
        tiny.base, num_engines=1, resources=ENGINE, max_restarts=2
    ) as ray_fleet:
        actor = ray_fleet.actors[0]
        async with pipeline(tiny, tmp_path, ray_fleet.fleet) as (sup, sink):
            assert_pinned(await evaluate(sup, sink, tiny, 1), engines=1)
            actor_pid, server_pid = await await_ref(actor.pids.remote())
            ray.kill(actor, no_restart=False)
            with trio.fail_after(30):
                await gone(actor_pid)
                await gone(server_pid)
            skipped = await evaluate(sup, sink, tiny, 2)
            assert (skipped.status, skipped.reason) == ("skipped", "unhealthy")
            with trio.fail_after(120):
                await answering(actor)
            restarted_pid, _ = await await_ref(actor.pids.remote())
            assert restarted_pid != actor_pid
            # The restarted server serves the base weights; the pin must load the snapshot.
            assert await ray_fleet.engines[0].weight_version() != "3"
            assert_pinned(await evaluate(sup, sink, tiny, 3), engines=1)
            # A server that dies takes its actor with it, and Ray restarts both.
            _, server_pid = await await_ref(actor.pids.remote())
            os.kill(server_pid, signal.SIGKILL)
            with trio.fail_after(30):
                await gone(restarted_pid)
            with trio.fail_after(120):
                await answering(actor)
            assert_pinned(await evaluate(sup, sink, tiny, 4), engines=1)


@ray.remote(num_cpus=0.1)
def wait_forever(started: str) -> None:
    Path(started).touch()
    while True:
        time.sleep(1)


class HangingRayTask(CheckpointEvalFn):
    """Awaits a Ray task that never returns."""

    def __init__(self, started: Path) -> None:
        self.started = started
        self.refs: list[Any] = []

    async def evaluate_checkpoint(
        self, checkpoint_dir: str, input: RolloutFnEvalInput
    ) -> RolloutFnEvalOutput:
        ref = wait_forever.remote(str(self.started))
        self.refs.append(ref)
        await await_ref(ref, force=True)
        raise AssertionError("the task never returns")


@pytest.mark.timeout(120)
async def test_close_is_bounded_when_a_ray_eval_task_hangs_and_the_task_is_cancelled(
    tiny: TinyModels, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    eval_fn = HangingRayTask(started)
    sink = MemorySink()
    async with EvalSupervisor.open(EvalConfig(), eval_fn=eval_fn, sink=sink) as sup:
        await sup.submit(1, checkpoint_dir=tiny.base)
        with trio.fail_after(60):
            while not started.exists():  # noqa: ASYNC110 - set by another process
                await trio.sleep(0.05)
        begun = trio.current_time()
        report = await sup.aclose(timeout=2.0)
        assert trio.current_time() - begun < 2.5
    assert report.abandoned == [1]
    assert [(o.step, o.reason) for o in sink.outcomes] == [(1, "closed")]
    with trio.fail_after(30), pytest.raises(ray.exceptions.TaskCancelledError):
        await await_ref(eval_fn.refs[0])


@pytest.mark.timeout(240)
async def test_a_ray_engine_on_the_node_address_requires_the_fleets_key(tiny: TinyModels) -> None:
    async with RayFleet.open(tiny.base, num_engines=1, resources={"num_cpus": 0.5}) as ray_fleet:
        assert ray_fleet.api_key and ray_fleet.fleet.api_key == ray_fleet.api_key
        await ray_fleet.fleet.pin(str(tiny.step1), "1")
        url = ray_fleet.fleet.urls[0]
        assert url.startswith(f"http://{ray.util.get_node_ip_address()}:")
        async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            assert (await client.get("/health")).status_code == 200
            load = {"model_path": str(tiny.step2), "weight_version": "evil"}
            assert (await client.post("/update_weights_from_disk", json=load)).status_code == 401
        answers = await ray_fleet.fleet.complete(PROMPTS, max_tokens=4)
        assert {answer.weight_version for answer in answers} == {"1"}


@pytest.mark.timeout(120)
async def test_an_engine_actor_that_cannot_start_is_a_fleet_start_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-model"
    with pytest.raises(FleetStartError, match="^an engine actor did not come up") as raised:
        async with RayFleet.open(missing, num_engines=1, resources=ENGINE, startup_timeout=60):
            pass
    assert "before it was healthy" in str(raised.value)

"""Engines as Ray actors on the Ray tests' local cluster (``ray_cluster``): pinned and
evaluated through EvalSupervisor on the node's address behind the fleet's key, a killed actor
restarted by Ray and pinned again (one fleet of two engines for both), a hanging Ray task cut
off at close, and an actor that cannot start. Wall-clock bound: each test has a timeout."""

from __future__ import annotations

import os
import signal
import time
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
from actorsys.fleet.ray import ACTOR_ANSWER_TIMEOUT, RayFleet, await_ref  # noqa: E402
from tests.fleet.conftest import TinyModels  # noqa: E402
from tests.fleet.pipeline import assert_pinned, evaluate, pipeline  # noqa: E402
from tests.fleet.ray_cluster import RAY_TIER  # noqa: E402
from tests.models import PROMPTS  # noqa: E402

pytestmark = [*RAY_TIER, pytest.mark.usefixtures("ray_cluster")]

ENGINE = {"num_cpus": 0.5}


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


async def assert_keyed(ray_fleet: RayFleet, tiny: TinyModels, version: str) -> None:
    """Each engine listens on its node's address, so it serves the fleet's key only: a load
    without it is refused, and the fleet still answers at ``version``."""
    assert ray_fleet.api_key and ray_fleet.fleet.api_key == ray_fleet.api_key
    for url in ray_fleet.fleet.urls:
        assert url.startswith(f"http://{ray.util.get_node_ip_address()}:")
        async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            assert (await client.get("/health")).status_code == 200
            load = {"model_path": str(tiny.step1), "weight_version": "evil"}
            assert (await client.post("/update_weights_from_disk", json=load)).status_code == 401
    answers = await ray_fleet.fleet.complete(PROMPTS, max_tokens=4)
    assert {answer.weight_version for answer in answers} == {version}


@pytest.mark.timeout(420)
async def test_engine_actors_serve_the_pinned_snapshot_to_the_key_and_ray_restarts_a_killed_one(
    tiny: TinyModels, tmp_path: Path
) -> None:
    """Two engine actors serve exactly the pinned snapshot, behind the fleet's key. A killed
    actor skips the point, and is pinned again once Ray restarted it; so is one whose server
    died (the server takes its actor with it)."""
    async with RayFleet.open(
        tiny.base, num_engines=2, resources=ENGINE, max_restarts=2
    ) as ray_fleet:
        assert len(ray_fleet.actors) == 2
        actor, engine = ray_fleet.actors[0], ray_fleet.engines[0]
        async with pipeline(tiny, tmp_path, ray_fleet.fleet) as (sup, sink):
            for step in (1, 2):
                assert_pinned(await evaluate(sup, sink, tiny, step), engines=2)
            assert len(set(ray_fleet.fleet.urls)) == 2
            await assert_keyed(ray_fleet, tiny, "2")

            actor_pid, server_pid = await await_ref(actor.pids.remote())
            ray.kill(actor, no_restart=False)
            with trio.fail_after(30):
                await gone(actor_pid)
                await gone(server_pid)
            # An actor that Ray is restarting holds the call for its URL until it is back:
            # the pin waits a short while, never for the whole restart.
            engine.answer_timeout = 2.0
            skipped = await evaluate(sup, sink, tiny, 3)
            assert (skipped.status, skipped.reason) == ("skipped", "unhealthy")
            engine.answer_timeout = ACTOR_ANSWER_TIMEOUT
            with trio.fail_after(120):
                await answering(actor)
            restarted_pid, _ = await await_ref(actor.pids.remote())
            assert restarted_pid != actor_pid
            # The restarted server serves the base weights; the pin must load the snapshot.
            assert await engine.weight_version() != "4"
            assert_pinned(await evaluate(sup, sink, tiny, 4), engines=2)

            _, server_pid = await await_ref(actor.pids.remote())
            os.kill(server_pid, signal.SIGKILL)
            with trio.fail_after(30):
                await gone(restarted_pid)
            with trio.fail_after(120):
                await answering(actor)
            assert_pinned(await evaluate(sup, sink, tiny, 5), engines=2)


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


@pytest.mark.timeout(120)
async def test_an_engine_actor_that_cannot_start_is_a_fleet_start_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-model"
    with pytest.raises(FleetStartError, match="^an engine actor did not come up") as raised:
        async with RayFleet.open(missing, num_engines=1, resources=ENGINE, startup_timeout=60):
            pass
    assert "before it was healthy" in str(raised.value)

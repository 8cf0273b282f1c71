"""A Ray engine listens on its node's address, the one --host it is given (never a second
one after 127.0.0.1), and answers nothing but /health without the fleet's key; the fleet's
clients pin and complete with it. One local cluster (two CPUs)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

ray = pytest.importorskip("ray")

from actorsys.fleet.ray import RayFleet  # noqa: E402
from tests.fleet.conftest import TinyModels  # noqa: E402
from tests.models import PROMPTS  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[None]:
    ray.init(
        num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
        object_store_memory=80 * 1024 * 1024,
    )
    try:
        yield
    finally:
        ray.shutdown()


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

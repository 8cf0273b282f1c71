"""How long the embedded engine's ``/health`` takes to answer while a large prompt is read and
tokenized, side by side with an idle engine (one engine process, the tiny test model).

Prints the median and worst ``/health`` latency idle and during a ``--prompt-mb`` MB prompt
(answered 400: far more tokens than the model's positions, after it was tokenized), and their
ratio. Before bodies were parsed off the event loop, an 8 MB prompt stalled ``/health`` 4.4 s.

    python bench/engine_health.py [--prompt-mb 3.5] [--probes 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from actorsys.fleet.local import LocalFleet, embedded  # noqa: E402
from tests.models import make_model  # noqa: E402

PROBE_INTERVAL = 0.02


async def health_latencies(client: httpx.AsyncClient, url: str, until: trio.Event) -> list[float]:
    latencies: list[float] = []
    while not until.is_set():
        started = time.perf_counter()
        response = await client.get(f"{url}/health")
        response.raise_for_status()
        latencies.append(time.perf_counter() - started)
        await trio.sleep(PROBE_INTERVAL)
    return latencies


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="actorsys-bench-") as tmp:
        model = Path(tmp) / "base"
        make_model(model, seed=0)
        async with LocalFleet.open([embedded(str(model))]) as local:
            url = local.urls[0]
            headers = {"Authorization": f"Bearer {local.api_key}"}
            async with httpx.AsyncClient(timeout=120.0, headers=headers) as client:
                idle_done = trio.Event()
                idle: list[float] = []

                async def idle_probes() -> None:
                    idle.extend(await health_latencies(client, url, idle_done))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(idle_probes)
                    await trio.sleep(args.probes * PROBE_INTERVAL)
                    idle_done.set()

                prompt = "the quick brown fox " * int(args.prompt_mb * 1024 * 1024 / 20)
                busy_done = trio.Event()
                busy: list[float] = []
                answer: dict[str, object] = {}

                async def busy_probes() -> None:
                    busy.extend(await health_latencies(client, url, busy_done))

                async def large() -> None:
                    started = time.perf_counter()
                    response = await client.post(f"{url}/v1/completions",
                                                 json={"prompt": prompt, "max_tokens": 1})
                    answer["status"] = response.status_code
                    answer["seconds"] = time.perf_counter() - started
                    busy_done.set()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(busy_probes)
                    nursery.start_soon(large)
    print(f"/health latency, {len(idle)} probes idle, {len(busy)} during a "
          f"{len(prompt) / 1e6:.1f} MB prompt (answered {answer['status']} after "
          f"{answer['seconds']:.2f} s):")
    print(f"  idle:   median {statistics.median(idle) * 1e3:7.1f} ms   worst "
          f"{max(idle) * 1e3:7.1f} ms")
    print(f"  during: median {statistics.median(busy) * 1e3:7.1f} ms   worst "
          f"{max(busy) * 1e3:7.1f} ms")
    print(f"  ratio of worst latencies (during / idle): {max(busy) / max(idle):.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-mb", type=float, default=3.5)
    parser.add_argument("--probes", type=int, default=100)
    trio.run(main, parser.parse_args())

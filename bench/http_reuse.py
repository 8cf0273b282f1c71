"""What one client per engine gains: requests/s of an engine's version read (``GET`` with the
key, the pin's most frequent request) through its one kept client, against a new client and
connection per request (what every request did before), on the CPU engine and on vLLM.

Run: ``.venv/bin/python bench/http_reuse.py [--requests 300 --rounds 3] [--vllm]``

The two ways alternate in rounds on the same engine, so noise hits both alike; each row gives
the median requests/s of each and their ratio. "New client" closes the engine's client after
each request (``engine.aclose()``), so the next one builds a client and opens a connection,
as a client per request does. Sequential requests, one at a time: the latency a pin sees.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actorsys.fleet import Engine  # noqa: E402
from actorsys.fleet.local import LocalFleet, embedded, vllm  # noqa: E402
from tests.models import make_model  # noqa: E402

VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"


async def rate(engine: Engine, requests: int, *, reuse: bool) -> float:
    """Requests/s of ``requests`` version reads, one at a time."""
    close = engine.aclose  # the kept client of an HTTP engine (HttpEngine.aclose)
    await close()
    start = time.perf_counter()
    for _ in range(requests):
        await engine.weight_version()
        if not reuse:
            await close()
    return requests / (time.perf_counter() - start)


async def compare(engine: Engine, requests: int, rounds: int) -> tuple[float, float]:
    kept, fresh = [], []
    await rate(engine, 10, reuse=True)  # warm up: the server's first answers are slower
    for _ in range(rounds):
        kept.append(await rate(engine, requests, reuse=True))
        fresh.append(await rate(engine, requests, reuse=False))
    return statistics.median(kept), statistics.median(fresh)


async def main(args: argparse.Namespace) -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="actorsys-bench-") as tmp:
        root = Path(tmp)
        make_model(root / "base", seed=0, hidden=64, layers=2, tied=True)
        async with LocalFleet.open([embedded(str(root / "base"))], startup_timeout=300) as local:
            rows.append(("CPU engine (embedded)", *await compare(
                local.engines[0].client, args.requests, args.rounds)))
        if args.vllm:
            async with LocalFleet.open([vllm(str(root / "base"), python=str(VLLM_PYTHON))],
                                       startup_timeout=400) as local:
                rows.append(("vLLM (CPU build)", *await compare(
                    local.engines[0].client, args.requests, args.rounds)))
    print(f"{args.requests} sequential version reads x {args.rounds} rounds, medians; "
          f"{os.cpu_count()} cores (a shared machine: noisy; the ratio is side by side)\n")
    print("| engine | one client, req/s | new client per request, req/s | ratio |")
    print("|---|---|---|---|")
    for name, kept, fresh in rows:
        print(f"| {name} | {kept:.0f} | {fresh:.0f} | {kept / fresh:.2f}x |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vllm", action="store_true", help="also measure one vLLM server")
    trio.run(main, parser.parse_args())

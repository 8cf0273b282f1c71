"""Throughput of DatasetEval against the ceiling: a bare client saturating the same engines.

Run: ``.venv/bin/python bench/evals.py [--prompts 256 --max-tokens 16 --concurrency 32]``

Starts two embedded engines (one torch thread each) serving a tiny Llama, pins them to a
snapshot, then, alternating ``--repeats`` times, completes the same prompts

- with a bare client: one ``httpx.AsyncClient``, ``--concurrency`` requests in flight
  round-robin over the engines, nothing checked or scored (the ceiling);
- with ``DatasetEval`` on a pinned ``Fleet`` of those engines: version checks, retries,
  scoring, metrics,

on one engine and on both. Prints prompts per second (medians), ``bare / ours`` (our
overhead) and ``2 engines / 1 engine`` (scaling).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actorsys import Fleet, RolloutFnEvalInput  # noqa: E402
from actorsys.evals import DatasetEval, EvalDataset  # noqa: E402
from actorsys.fleet.local import LocalFleet, embedded  # noqa: E402
from tests.models import CORPUS, make_model, make_snapshot  # noqa: E402


def prompts(count: int) -> list[str]:
    words = " ".join(CORPUS).split()
    return [" ".join(words[i % len(words) : i % len(words) + 3]) for i in range(count)]


async def bare(
    urls: list[str], texts: list[str], max_tokens: int, concurrency: int, api_key: str | None
) -> float:
    """Seconds for one client to complete ``texts`` on ``urls``, ``concurrency`` at a time."""
    limiter = trio.Semaphore(concurrency)
    targets = itertools.cycle(urls)
    limits = httpx.Limits(max_connections=concurrency)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=120.0, limits=limits, headers=headers) as client:
        started = time.perf_counter()

        async def one(url: str, text: str) -> None:
            async with limiter:
                body = {"prompt": text, "max_tokens": max_tokens, "temperature": 0.0}
                response = await client.post(f"{url}/v1/completions", json=body)
                response.raise_for_status()

        async with trio.open_nursery() as nursery:
            for text in texts:
                nursery.start_soon(one, next(targets), text)
        return time.perf_counter() - started


async def ours(fleet: Fleet, evaluation: DatasetEval, snapshot: str) -> float:
    started = time.perf_counter()
    output = await evaluation.evaluate_checkpoint(
        snapshot, RolloutFnEvalInput(rollout_id=1, hf_dir=snapshot, fleet=fleet)
    )
    elapsed = time.perf_counter() - started
    assert output.metrics is not None
    assert output.metrics[f"eval/{evaluation.datasets[0].name}/errors"] == 0.0
    return elapsed


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="actorsys-bench-") as tmp:
        root = Path(tmp)
        make_model(root / "base", seed=0, hidden=args.hidden, layers=args.layers)
        make_snapshot(root / "base", root / "snap", seed=1)
        snapshot = str(root / "snap")
        texts = prompts(args.prompts)
        data = root / "bench.jsonl"
        data.write_text("".join(json.dumps({"prompt": t, "label": "x"}) + "\n" for t in texts))
        dataset = EvalDataset.from_jsonl(data, max_tokens=args.max_tokens)
        evaluation = DatasetEval(dataset, concurrency=args.concurrency)
        print(f"model: hidden {args.hidden}, {args.layers} layers; {os.cpu_count()} cores; "
              f"{args.prompts} prompts x {args.max_tokens} tokens, concurrency "
              f"{args.concurrency}, {args.repeats} repeats, medians\n")
        specs = [embedded(str(root / "base"), threads=1) for _ in range(2)]
        async with LocalFleet.open(specs, startup_timeout=300) as local:
            fleets = {1: Fleet([local.engines[0].client]), 2: local.fleet}
            rates: dict[tuple[str, int], float] = {}
            for count, fleet in fleets.items():
                await fleet.pin(snapshot, "1")
                urls = fleet.urls
                await bare(urls, texts, args.max_tokens, args.concurrency, fleet.api_key)  # warm-up
                await ours(fleet, evaluation, snapshot)
                bare_times, our_times = [], []
                for _ in range(args.repeats):
                    bare_times.append(
                        await bare(urls, texts, args.max_tokens, args.concurrency, fleet.api_key)
                    )
                    our_times.append(await ours(fleet, evaluation, snapshot))
                rates["bare", count] = args.prompts / statistics.median(bare_times)
                rates["ours", count] = args.prompts / statistics.median(our_times)
        print("| engines | bare client, prompts/s | DatasetEval, prompts/s | bare / ours |")
        print("|---|---|---|---|")
        for count in (1, 2):
            ratio = rates["bare", count] / rates["ours", count]
            print(f"| {count} | {rates['bare', count]:.1f} | {rates['ours', count]:.1f} | "
                  f"{ratio:.2f} |")
        print(f"\n2 engines / 1 engine: bare {rates['bare', 2] / rates['bare', 1]:.2f}, "
              f"DatasetEval {rates['ours', 2] / rates['ours', 1]:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    trio.run(main, parser.parse_args())

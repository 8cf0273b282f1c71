"""Where ``submit``'s weight copy runs, and what it costs the actors and an evaluation.

Run: ``.venv/bin/python bench/submit_stall.py`` (about a minute on 2 cores; ``--quick`` for a
smoke run). Side by side in one process, alternating, with medians over repetitions:

1. ``submit(step, model=...)``: the copy in a worker thread (what ``submit`` does);
2. the same copy on the trio thread (``reserve``, ``capture`` in the calling thread, ``launch``:
   what ``submit`` did before, and what a host thread such as the bridge's does);
3. the floor: a bare copy of the state dict into reused CPU buffers;

and, during each submit, what an evaluation running beside it sees: a trio task sending
requests one after another to a loopback HTTP server (its longest request, against the same
loop with no submit), and the trio thread's longest gap between 1 ms ticks. Prints a table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial

import httpx
import torch
import trio
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel

from actorsys import CheckpointEvalFn, EvalConfig, EvalSupervisor, MemorySink
from actorsys.contracts import RolloutFnEvalInput, RolloutFnEvalOutput
from actorsys.snapshot import capture
from actorsys.supervisor import SubmitRequest

MB = 1000**2
SERVER = (
    "import http.server as s; "
    "s.ThreadingHTTPServer(('127.0.0.1', {port}), s.SimpleHTTPRequestHandler).serve_forever()"
)


class Nothing(CheckpointEvalFn):
    async def evaluate_checkpoint(
        self, checkpoint_dir: str, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        return RolloutFnEvalOutput(data={})


def model_of(quick: bool) -> PreTrainedModel:
    hidden, layers, vocab, intermediate = (256, 2, 8000, 688) if quick else (768, 12, 32000, 2048)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64, tie_word_embeddings=False,
    )
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config)
    return model.eval()


class Beside:
    """What runs beside a submit: requests to the loopback server, and 1 ms ticks."""

    def __init__(self, client: httpx.AsyncClient, url: str) -> None:
        self.client, self.url = client, url
        self.requests: list[float] = []
        self.gaps: list[float] = []
        self.last_tick = time.perf_counter()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._ask)
            nursery.start_soon(self._tick)
            task_status.started()

    async def _ask(self) -> None:
        while True:
            started = time.perf_counter()
            (await self.client.get(self.url)).raise_for_status()
            self.requests.append(time.perf_counter() - started)

    async def _tick(self) -> None:
        while True:
            await trio.sleep(0.001)
            now = time.perf_counter()
            self.gaps.append(now - self.last_tick)
            self.last_tick = now


async def during(
    what: Callable[[], Awaitable[object]], client: httpx.AsyncClient, url: str
) -> tuple[float, float, float]:
    """``what()``'s duration, and the longest request and tick gap beside it."""
    beside = Beside(client, url)
    async with trio.open_nursery() as nursery:
        await nursery.start(beside.run)
        await trio.sleep(0.05)  # the loop is running: measure from here
        beside.requests.clear()
        beside.gaps.clear()
        started = time.perf_counter()
        await what()
        ended = time.perf_counter()
        # The gap still open when ``what`` returns (all of it, if the trio thread never ran),
        # and the requests it held up, which end just after.
        beside.gaps.append(ended - beside.last_tick)
        await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    return ended - started, max(beside.requests, default=0.0), max(beside.gaps)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    model = model_of(args.quick)
    state = model.state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    floor = {name: torch.empty_like(t) for name, t in state.items()}
    port = 18000 + os.getpid() % 1000
    server = subprocess.Popen(  # noqa: ASYNC220 - once, before anything is measured
        [sys.executable, "-c", SERVER.format(port=port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"
    rows: dict[str, list[tuple[float, float, float]]] = {"worker": [], "trio": [], "idle": []}
    floors: list[float] = []
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            for _ in range(100):
                try:
                    (await client.get(url)).raise_for_status()
                    break
                except httpx.TransportError:
                    await trio.sleep(0.05)
            with tempfile.TemporaryDirectory() as staging:
                config = EvalConfig(hf_dir=staging, max_in_flight=2, keep_snapshots=0)
                async with EvalSupervisor.open(config, eval_fn=Nothing(), sink=MemorySink()) as sup:
                    await sup.prepare(model=model)

                    async def on_trio_thread(step: int) -> None:
                        reservation = await sup.reserve(SubmitRequest(step, model=model))
                        assert reservation is not None and reservation.buffers is not None
                        weights = capture(model, buffers=reservation.buffers, plan=reservation.plan)
                        sup.launch(reservation, weights)

                    step = 0
                    for rep in range(args.reps + 1):
                        started = time.perf_counter()
                        for name, tensor in state.items():
                            floor[name].copy_(tensor)
                        floors.append(time.perf_counter() - started)
                        for variant in ("worker", "trio", "idle"):
                            step += 1
                            work: Callable[[], Awaitable[object]]
                            if variant == "worker":
                                work = partial(sup.submit, step, model=model)
                            elif variant == "trio":
                                work = partial(on_trio_thread, step)
                            else:
                                work = partial(trio.sleep, floors[-1])
                            measured = await during(work, client, url)
                            if rep:  # the first round warms up
                                rows[variant].append(measured)
                            await sup.drain()
    finally:
        server.kill()
        server.wait()
    bare = statistics.median(floors[1:])
    print(f"model {nbytes / MB:.0f} MB, {os.cpu_count()} cores, torch threads "
          f"{torch.get_num_threads()}, {args.reps} reps (medians)")
    print(f"{'':28} {'trainer stall':>14} {'/ bare copy':>12} {'longest request':>16} {'longest tick':>13}")
    labels = {"worker": "submit: copy in a thread", "trio": "copy on the trio thread",
              "idle": "no submit (same time)"}
    for variant, label in labels.items():
        took, request, gap = (statistics.median(column) for column in zip(*rows[variant], strict=True))
        print(f"{label:28} {took * 1000:11.1f} ms {took / bare:11.2f}x {request * 1000:13.1f} ms "
              f"{gap * 1000:10.1f} ms")
    print(f"{'bare copy':28} {bare * 1000:11.1f} ms")


if __name__ == "__main__":
    trio.run(main)

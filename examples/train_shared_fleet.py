"""Shared mode: a trainer evaluates on its own rollout engine, without a copy, an export or a
reload by actorsys, and without stopping its rollouts.

    python examples/train_shared_fleet.py --steps 12 --eval-every 4 [--engine vllm]

The trainer here does what an RL trainer's loop does: it trains, saves its weights every step
and has its rollout engine (a real CPU engine process on loopback, ``python -m actorsys
engine``, or vLLM's CPU server with ``--engine vllm``) load them from disk with their version,
while a rollout thread keeps sending completions to that engine. Each sync runs inside
``weight_update()``: that is the only place the trainer may wait, and only for the served
points admitted before it, within ``--eval-shared-update-timeout`` (``--eval-shared-update
preempt`` cuts them instead). Every ``K`` steps it calls ``submit(step, served=True)``: the
evaluation (a ``DatasetEval`` on a local JSONL) runs on the weights the engine serves now,
after actorsys read the engine's version back equal to the step's. The fleet's
``eval_priority=1`` queues the evaluation's requests behind the rollouts' (the CPU engine
orders by priority; vLLM is started with ``--scheduling-policy priority``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

import httpx
import tiny_lm
import torch
import transformers
import trio

from actorsys import EvalSupervisor, Fleet, MemorySink
from actorsys.evals import DatasetEval, EvalDataset
from actorsys.fleet.local import LocalFleet
from actorsys.watch.fleets import engine_specs


class Rollouts:
    """The trainer's rollouts: completions sent from a thread, one after another, until
    stopped; each answered one is counted, each failure kept."""

    def __init__(self, url: str, key: str | None) -> None:
        self.url, self.key = url, key
        self.done = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rollouts", daemon=True)

    def __enter__(self) -> Rollouts:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        body = {"prompt": "the trainer", "max_tokens": 8, "temperature": 1.0}
        with httpx.Client(timeout=60.0, headers=headers) as client:
            while not self._stop.is_set():
                try:
                    client.post(f"{self.url}/v1/completions", json=body).raise_for_status()
                    self.done += 1
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))


def write_dataset(path: str) -> EvalDataset:
    """A local JSONL of prompts and the word that follows each in the training texts."""
    with open(path, "w", encoding="utf-8") as f:
        for text in tiny_lm.TRAIN_TEXTS:
            words = text.split()
            f.write(json.dumps({"prompt": " ".join(words[:4]), "label": words[4]}) + "\n")
    return EvalDataset.from_jsonl(path, name="next_word", max_tokens=1)


def save(model: torch.nn.Module, tokenizer: object, path: str) -> None:
    """What the trainer writes for its engine at each step: an HF checkpoint."""
    model.save_pretrained(path)  # type: ignore[operator]
    tokenizer.save_pretrained(path)  # type: ignore[attr-defined]


async def main(argv: list[str] | None = None) -> int:
    engine_flag = argparse.ArgumentParser(add_help=False)
    engine_flag.add_argument("--engine", choices=("embedded", "vllm"), default="embedded",
                             help="the rollout engine: the CPU engine, or vLLM (needs .venv-vllm)")
    known, rest = engine_flag.parse_known_args(argv if argv is not None else sys.argv[1:])
    args = tiny_lm.parse_training_args(__doc__.split("\n")[0], rest, steps=12, every=4)
    transformers.utils.logging.disable_progress_bar()
    tokenizer, model_config, config = tiny_lm.set_up(args)
    workdir = os.path.dirname(str(config.base_checkpoint))
    model = tiny_lm.new_model(model_config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    inputs = tiny_lm.batch(tokenizer, tiny_lm.TRAIN_TEXTS)
    sync_dir = os.path.join(workdir, "synced")
    model.save_pretrained(str(config.base_checkpoint))  # the weights the engine starts from
    dataset = write_dataset(os.path.join(workdir, "next_word.jsonl"))
    sink = MemorySink()

    specs = engine_specs(str(config.base_checkpoint), engines=1, flavor=known.engine,
                         vllm_args=("--scheduling-policy", "priority"))
    async with LocalFleet.open(specs, log_dir=os.path.join(workdir, "logs"),
                               startup_timeout=600) as local:
        (engine,) = [e.client for e in local.engines]
        with Rollouts(local.urls[0], local.api_key) as rollouts:
            async with EvalSupervisor.open(
                config, eval_fn=DatasetEval([dataset]), fleet=Fleet([engine], shared=True, eval_priority=1),
                sink=sink,
            ) as sup:
                for step in range(1, args.steps + 1):
                    loss = await trio.to_thread.run_sync(
                        tiny_lm.train_step, model, optimizer, inputs
                    )
                    path = os.path.join(sync_dir, f"step_{step}")
                    await trio.to_thread.run_sync(save, model, tokenizer, path)
                    async with sup.weight_update():  # the trainer's weight sync
                        await engine.load_weights(path, str(step))
                    line = f"step {step:>3}: train loss {loss:.3f}"
                    if step % args.eval_every == 0:
                        admitted = await sup.submit(step, served=True)
                        line += f", served eval {'submitted' if admitted else 'not admitted'}"
                    print(line, flush=True)
                drained = await sup.drain(timeout=120)
                statistics = sup.statistics()
    for outcome in sink.outcomes:
        result = (f"next word right {outcome.metrics['eval/next_word']:.2f}" if outcome.ok
                  else f"skipped ({outcome.reason})")
        print(f"  eval step {outcome.step:>3} (weights {outcome.weight_version}): {result}")
    print(f"rollouts answered meanwhile: {rollouts.done}, failed: {len(rollouts.failures)}; "
          f"weight updates that waited for an evaluation: {statistics.weight_update_waits} "
          f"({statistics.weight_update_wait_seconds:.2f} s); pending after drain: "
          f"{drained.pending}")
    tiny_lm.write_results(args.results, sink.outcomes, [])
    return 0 if not drained.pending and not rollouts.failures else 1


if __name__ == "__main__":
    sys.exit(trio.run(main))

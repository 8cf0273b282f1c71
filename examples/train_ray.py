"""A Ray trainer: an asyncio driver, a group of 2 CPU training workers (data parallel over
gloo), a collective export, and evaluation on engines that run as Ray actors.

    python examples/train_ray.py --steps 30 --eval-every 10

Step 0 evaluates the base checkpoint (random weights) as the baseline. Every K steps the
driver asks each worker to stage a copy of its weights, then submits the
step with ``export=``: an asyncio coroutine that has every worker write its shard of the
checkpoint into the directory the Exporter gives (``asyncio.gather`` over Ray calls, on the
driver's own loop). The Exporter marks the directory complete and renames it; a RayFleet
engine loads it and the eval fn scores greedy continuations of the training texts on it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import socket
import sys
from typing import Any

import ray
import tiny_lm
import torch
import transformers

from actorsys import (
    CheckpointEvalFn,
    EvalConfig,
    Outcome,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from actorsys.fleet.ray import RayFleet
from bridge import AsyncEvalBridge

WORLD_SIZE = 2
PROMPT_WORDS = 4
ANSWER_WORDS = 3
NON_WEIGHT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json",
                    "special_tokens_map.json", "generation_config.json")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--eval-every", type=int, default=10, metavar="K")
    parser.add_argument("--engines", type=int, default=1, help="engine actors (default 1)")
    parser.add_argument("--num-cpus", type=float, default=2, help="CPUs of the local Ray cluster")
    parser.add_argument("--ray-address", help="join the running Ray cluster at this address "
                        "instead of starting a local one of --num-cpus CPUs")
    parser.add_argument("--workdir", help="where the base checkpoint and snapshots go")
    parser.add_argument("--results", help="write the outcomes and the close report here (JSON)")
    EvalConfig.add_arguments(parser)
    return parser.parse_args(argv)


@ray.remote(num_cpus=0.5)
class TrainWorker:
    """One rank of the training group: a replica of the model, its share of the data,
    gradients averaged across ranks, and its shard of every checkpoint."""

    def __init__(self, rank: int, init_method: str, base: str, texts: list[str]) -> None:
        torch.set_num_threads(1)
        torch.distributed.init_process_group(
            "gloo", init_method=init_method, rank=rank, world_size=WORLD_SIZE
        )
        self.rank = rank
        self.base = base
        tokenizer = transformers.AutoTokenizer.from_pretrained(base)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(base)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-3)
        encoded = tokenizer(texts[rank::WORLD_SIZE], return_tensors="pt", padding=True)
        labels = encoded["input_ids"].masked_fill(encoded["attention_mask"] == 0, -100)
        self.inputs = {**encoded, "labels": labels}
        self.staged: dict[int, dict[str, torch.Tensor]] = {}

    def train_step(self) -> float:
        self.model.train()
        loss = self.model(**self.inputs).loss
        self.optimizer.zero_grad()
        loss.backward()
        for parameter in self.model.parameters():
            if parameter.grad is not None:
                torch.distributed.all_reduce(parameter.grad)
                parameter.grad /= WORLD_SIZE
        self.optimizer.step()
        return float(loss.detach())

    def shard_names(self) -> list[str]:
        names = sorted(self.model.state_dict())
        return names[self.rank::WORLD_SIZE]

    def stage(self, step: int) -> None:
        """Copy this rank's shard of the weights now; training may go on right after."""
        state = self.model.state_dict()
        self.staged[step] = {name: state[name].detach().clone() for name in self.shard_names()}

    def drop(self, step: int) -> None:
        self.staged.pop(step, None)

    def export_shard(self, step: int, path: str) -> str:
        """Write the shard staged at ``step`` into ``path`` (rank 0 also writes the index
        and the non-weight files); fsync'd, so the Exporter's rename publishes whole files."""
        from safetensors.torch import save_file

        tensors = self.staged.pop(step)
        shard = f"model-{self.rank + 1:05d}-of-{WORLD_SIZE:05d}.safetensors"
        files = [shard]
        save_file(tensors, os.path.join(path, shard), metadata={"format": "pt"})
        if self.rank == 0:
            names = sorted(self.model.state_dict())
            weight_map = {
                name: f"model-{i % WORLD_SIZE + 1:05d}-of-{WORLD_SIZE:05d}.safetensors"
                for i, name in enumerate(names)
            }
            with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {}, "weight_map": weight_map}, f)
            files.append("model.safetensors.index.json")
            for name in NON_WEIGHT_FILES:
                if os.path.exists(os.path.join(self.base, name)):
                    shutil.copy(os.path.join(self.base, name), os.path.join(path, name))
                    files.append(name)
        for name in files:
            with open(os.path.join(path, name), "rb+") as f:
                os.fsync(f.fileno())
        return shard


class NextWords(CheckpointEvalFn):
    """Greedy continuations of the training texts' first words on the pinned fleet: the
    share whose next words are right."""

    async def evaluate_checkpoint(
        self, checkpoint_dir: str, eval_input: RolloutFnEvalInput
    ) -> RolloutFnEvalOutput:
        texts = [text.split() for text in tiny_lm.TRAIN_TEXTS]
        prompts = [" ".join(words[:PROMPT_WORDS]) for words in texts]
        answers = await eval_input.fleet.complete(prompts, max_tokens=ANSWER_WORDS)
        right = [
            answer.text.split()[:ANSWER_WORDS] == words[PROMPT_WORDS:PROMPT_WORDS + ANSWER_WORDS]
            for answer, words in zip(answers, texts, strict=True)
        ]
        return RolloutFnEvalOutput(
            data={"files": sorted(os.listdir(checkpoint_dir)),
                  "answers": [answer.text for answer in answers]},
            metrics={"eval/next_words_acc": sum(right) / len(right)},
        )


class PrintSink(tiny_lm.PrintSink):
    def record(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        if outcome.ok:
            print(f"  eval step {outcome.step:>4}: next-words accuracy "
                  f"{outcome.metrics['eval/next_words_acc']:.2f}", flush=True)
        else:
            print(f"  eval step {outcome.step:>4}: skipped ({outcome.reason})", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train on the worker group, evaluating every K steps on a RayFleet."""
    _, model_config, config = tiny_lm.set_up(args)
    base = os.fspath(config.base_checkpoint)
    tiny_lm.new_model(model_config).save_pretrained(base)
    init_method = f"tcp://127.0.0.1:{free_port()}"
    workers = [TrainWorker.remote(rank, init_method, base, tiny_lm.TRAIN_TEXTS)  # type: ignore[attr-defined]
               for rank in range(WORLD_SIZE)]

    async def export(step: int, path: str) -> None:
        await asyncio.gather(*(worker.export_shard.remote(step, path) for worker in workers))

    sink = PrintSink()
    async with RayFleet.open(base, num_engines=args.engines, resources={"num_cpus": 0.5}) as ray_fleet:
        async with AsyncEvalBridge(
            config, eval_fn=NextWords(), fleet=ray_fleet.fleet, sink=sink
        ) as evaluation:
            assert await evaluation.submit(0, checkpoint_dir=base)  # the baseline
            for step in range(1, args.steps + 1):
                losses = await asyncio.gather(*(worker.train_step.remote() for worker in workers))
                evaluation.note_step(step)
                if step % args.eval_every == 0:
                    await asyncio.gather(*(worker.stage.remote(step) for worker in workers))
                    admitted = await evaluation.submit(step, export=export)
                    if not admitted:
                        await asyncio.gather(*(worker.drop.remote(step) for worker in workers))
                    print(f"step {step:>4}: train loss {sum(losses) / len(losses):.3f}, eval "
                          f"point {'submitted' if admitted else 'not admitted'}", flush=True)
            drained = await evaluation.drain(timeout=120)
            report = await evaluation.close()
    print(f"done: {sink.summary()}; still pending after drain: {drained.pending}; "
          f"close clean: {report.clean}")
    return {"outcomes": [dataclasses.asdict(o) for o in sink.outcomes],
            "close": dataclasses.asdict(report)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    transformers.utils.logging.disable_progress_bar()
    if args.ray_address:
        ray.init(address=args.ray_address, log_to_driver=False, configure_logging=False)
    else:
        ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
                 log_to_driver=False, configure_logging=False, object_store_memory=80 * 1024 * 1024)
    try:
        results = asyncio.run(train(args))
    finally:
        ray.shutdown()
    if args.results:
        with open(args.results, "w", encoding="utf-8") as f:
            json.dump(results, f, default=repr)
    return 0 if results["close"]["clean"] else 1


if __name__ == "__main__":
    sys.exit(main())

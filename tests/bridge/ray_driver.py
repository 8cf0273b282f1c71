"""A Ray driver for the Ray test: an ``asyncio.run`` loop driving a training actor, blocking
its own loop on a sync ``ray.get`` for the weights, and evaluating through AsyncEvalBridge.

Usage: ``python ray_driver.py STAGING_DIR RAY_ADDRESS`` (a running cluster's); prints one JSON
line: the outcomes, the close report, and the driver's loop type and event-loop policy before
and after.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from typing import Any

import ray
import torch
from safetensors.torch import load_file

from actorsys import CheckpointEvalFn, EvalConfig, RolloutFnEvalInput, RolloutFnEvalOutput
from bridge import AsyncEvalBridge


@ray.remote
class Trainer:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(32, 32)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def step(self) -> float:
        loss = self.model(torch.randn(16, 32)).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def weights(self) -> dict[str, torch.Tensor]:
        return {name: t.detach().clone() for name, t in self.model.state_dict().items()}


class WeightNorm(CheckpointEvalFn):
    runtime = "thread"

    def evaluate_checkpoint(
        self, checkpoint_dir: str, eval_input: RolloutFnEvalInput
    ) -> RolloutFnEvalOutput:
        tensors = load_file(f"{checkpoint_dir}/model.safetensors")
        return RolloutFnEvalOutput(metrics={"eval/weight_norm": float(tensors["weight"].norm())})


async def loop_type() -> str:
    return type(asyncio.get_running_loop()).__qualname__


async def drive(staging: str) -> dict[str, Any]:
    trainer = Trainer.remote()  # type: ignore[attr-defined]
    config = EvalConfig(hf_dir=staging, max_in_flight=2, eval_timeout=60)
    async with AsyncEvalBridge(config, eval_fn=WeightNorm()) as evaluation:
        for step in range(1, 7):
            await trainer.step.remote()
            evaluation.note_step(step)
            if step % 2 == 0:
                weights = ray.get(trainer.weights.remote())  # blocks the driver's loop
                assert await evaluation.submit(step, state_dict=weights)
        await evaluation.drain(timeout=60)
        report = await evaluation.close()
        outcomes = evaluation.sink.outcomes  # type: ignore[attr-defined]
    return {"outcomes": [dataclasses.asdict(o) for o in outcomes],
            "close": dataclasses.asdict(report)}


def main(staging: str, address: str) -> None:
    ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        policy = type(asyncio.get_event_loop_policy()).__qualname__
        before = asyncio.run(loop_type())
        result = asyncio.run(drive(staging))
        after = asyncio.run(loop_type())
        result["loops"] = [before, after]
        result["policies"] = [policy, type(asyncio.get_event_loop_policy()).__qualname__]
    finally:
        ray.shutdown()
    print(json.dumps(result, default=repr))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

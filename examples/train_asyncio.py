"""An ``asyncio.run`` training driver (the shape of miles' async trainer) that evaluates every
K steps without waiting for the result.

    python examples/train_asyncio.py --steps 40 --eval-every 10

The driver awaits its rollouts, trains, and every K steps awaits ``submit``, which costs one
copy of the weights; the snapshot is scored in the background by
``tiny_lm.PerplexityEval`` and recorded at the step it came from. The supervisor runs on trio
in a thread of its own: the driver's event loop, policy and signal handlers stay as they are.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from typing import Any

import tiny_lm
import torch
import transformers

from actorsys import EvalConfig
from bridge import AsyncEvalBridge


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=10, metavar="K")
    parser.add_argument("--workdir", help="where the base checkpoint and snapshots go")
    parser.add_argument("--results", help="write the outcomes and the close report here (JSON)")
    EvalConfig.add_arguments(parser)
    return parser.parse_args(argv)


async def generate_rollout(tokenizer: Any, step: int) -> dict[str, torch.Tensor]:
    """Stands in for the rollout engines: the driver awaits its next batch."""
    await asyncio.sleep(0)
    return tiny_lm.batch(tokenizer, tiny_lm.TRAIN_TEXTS)


async def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train, evaluating every K steps; return the outcomes and the close report."""
    tokenizer, model_config, config = tiny_lm.set_up(args)

    model = tiny_lm.new_model(model_config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sink = tiny_lm.PrintSink()
    async with AsyncEvalBridge(config, eval_fn=tiny_lm.PerplexityEval(), sink=sink) as evaluation:
        for step in range(1, args.steps + 1):
            inputs = await generate_rollout(tokenizer, step)
            loss = tiny_lm.train_step(model, optimizer, inputs)
            evaluation.note_step(step)
            if step % args.eval_every == 0:
                admitted = await evaluation.submit(step, model=model)
                print(f"step {step:>4}: train loss {loss:.3f}, eval point "
                      f"{'submitted' if admitted else 'not admitted'}", flush=True)
        drained = await evaluation.drain(timeout=120)
        report = await evaluation.close()
    print(f"done: {sink.summary()}; still pending after drain: {drained.pending}; "
          f"close clean: {report.clean}")
    return {"outcomes": [dataclasses.asdict(o) for o in sink.outcomes],
            "close": dataclasses.asdict(report)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    transformers.utils.logging.disable_progress_bar()
    results = asyncio.run(train(args))
    if args.results:
        with open(args.results, "w", encoding="utf-8") as f:
            json.dump(results, f, default=repr)
    return 0 if results["close"]["clean"] else 1


if __name__ == "__main__":
    sys.exit(main())

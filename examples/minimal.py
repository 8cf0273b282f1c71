"""The smallest complete use of actorsys: train a tiny causal LM, evaluate three points live.

Every 5 steps the training loop hands its weights to ``EvalSupervisor.submit`` (one CPU copy)
and keeps training; in the background each point is exported as a Hugging Face checkpoint,
loaded back with transformers, scored on the training patterns, and recorded at its step.

    python examples/minimal.py
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

import torch
import trio
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as transformers_logging

from actorsys import (
    CheckpointEvalFn,
    EvalConfig,
    EvalSupervisor,
    MemorySink,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)

VOCAB = 256


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
    )
    return LlamaForCausalLM(config)


def batch(seed: int) -> torch.Tensor:
    """Sequences that repeat a short random pattern: learnable in a few steps."""
    generator = torch.Generator().manual_seed(seed)
    pattern = torch.randint(0, VOCAB, (8, 4), generator=generator)
    return pattern.repeat(1, 8)


class PatternLoss(CheckpointEvalFn):
    """Loads the checkpoint with transformers and reports its loss on the first pattern."""

    runtime = "thread"

    def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        model = AutoModelForCausalLM.from_pretrained(checkpoint_dir)
        tokens = batch(seed=0)
        with torch.no_grad():
            loss = model(input_ids=tokens, labels=tokens).loss.item()
        return RolloutFnEvalOutput(data={"sequences": len(tokens)}, metrics={"eval/loss": loss})


async def main(steps: int, every: int) -> None:
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sink = MemorySink()
    with tempfile.TemporaryDirectory(prefix="actorsys-minimal-") as staging:
        config = EvalConfig(hf_dir=staging, max_in_flight=2, keep_snapshots=1, eval_timeout=120)
        async with EvalSupervisor.open(config, eval_fn=PatternLoss(), sink=sink) as sup:
            for step in range(1, steps + 1):
                tokens = batch(seed=step % 4)
                loss = model(input_ids=tokens, labels=tokens).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                sup.note_step(step)
                if step % every == 0:
                    await sup.submit(step, model=model)
                    print(f"step {step:3d}  train loss {loss.item():.3f}  -> submitted for eval")
            report = await sup.drain(timeout=300)
        print(f"drained: settled {report.settled}, pending {report.pending}")
    for outcome in sink.outcomes:
        if outcome.ok:
            print(f"step {outcome.step:3d}  eval loss {outcome.metrics['eval/loss']:.3f}  "
                  f"(weights {outcome.weight_version}, lag {outcome.metrics['eval/lag_steps']:.0f} steps)")
        else:
            print(f"step {outcome.step:3d}  skipped: {outcome.reason} {outcome.data}")
    if not all(outcome.ok for outcome in sink.outcomes):
        raise SystemExit(1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--every", type=int, default=5)
    args = parser.parse_args()
    transformers_logging.disable_progress_bar()
    trio.run(main, args.steps, args.every)

"""A trainer that hands a ~1 GB model to a bridge, closes it and exits at once: the process
must exit 0, never abort while a thread of the pipeline is inside torch.

    python exit_host.py make-base DIR
        Save a Llama causal LM with random weights (about 1 GB of float32) to DIR with
        ``save_pretrained``: the base checkpoint the runs start from.
    python exit_host.py run sync|async BASE STAGING [--source checkpoint|model]
                        [--close-timeout SECONDS]
        Open an ``EvalBridge`` (or an ``AsyncEvalBridge`` under ``asyncio.run``) with
        ``base_checkpoint=BASE``, so its buffer sets are faulted in ahead of the first point in
        the background, submit step 1 (``checkpoint``: BASE itself, nothing to copy; ``model``:
        the model loaded from BASE, copied and exported), close and return from ``main``.
        Prints the close report as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from typing import Any

import torch

from actorsys import CheckpointEvalFn, EvalConfig, RolloutFnEvalInput, RolloutFnEvalOutput
from actorsys.outcome import CloseReport
from bridge import AsyncEvalBridge, EvalBridge

BASE_BYTES = 1_000_000_000


class Instant(CheckpointEvalFn):
    """Scores a checkpoint at once: the process's exit follows the close without a pause."""

    async def evaluate_checkpoint(
        self, checkpoint_dir: str, eval_input: RolloutFnEvalInput
    ) -> RolloutFnEvalOutput:
        return RolloutFnEvalOutput(data={}, metrics={"eval/score": 1.0})


def base_config() -> Any:
    from transformers import LlamaConfig

    hidden, layers = 1024, 16  # 16 layers of 16 M parameters, float32: about 1.08 GB
    return LlamaConfig(
        vocab_size=256, hidden_size=hidden, intermediate_size=4 * hidden,
        num_hidden_layers=layers, num_attention_heads=hidden // 32, num_key_value_heads=hidden // 32,
        head_dim=32, max_position_embeddings=512, tie_word_embeddings=False,
    )


def make_base(path: str) -> None:
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    torch.manual_seed(0)
    with torch.device("meta"):
        model = LlamaForCausalLM(base_config())
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(std=0.02)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert nbytes >= BASE_BYTES, nbytes
    model.save_pretrained(path)


def load_model(base: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)


def run_sync(config: EvalConfig, source: dict[str, Any], close_timeout: float | None) -> CloseReport:
    with EvalBridge(config, eval_fn=Instant()) as evaluation:
        assert evaluation.submit(1, **source)
        return evaluation.close(close_timeout)


async def run_async(
    config: EvalConfig, source: dict[str, Any], close_timeout: float | None
) -> CloseReport:
    async with AsyncEvalBridge(config, eval_fn=Instant()) as evaluation:
        assert await evaluation.submit(1, **source)
        return await evaluation.close(close_timeout)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("make-base").add_argument("dir")
    run = commands.add_parser("run")
    run.add_argument("kind", choices=["sync", "async"])
    run.add_argument("base")
    run.add_argument("staging")
    run.add_argument("--source", choices=["checkpoint", "model"], default="checkpoint")
    run.add_argument("--close-timeout", type=float, default=None)
    args = parser.parse_args(argv)
    if args.command == "make-base":
        make_base(args.dir)
        return 0
    config = EvalConfig(hf_dir=args.staging, base_checkpoint=args.base)
    source: dict[str, Any] = (
        {"checkpoint_dir": args.base} if args.source == "checkpoint"
        else {"model": load_model(args.base)}
    )
    if args.kind == "sync":
        report = run_sync(config, source, args.close_timeout)
    else:
        report = asyncio.run(run_async(config, source, args.close_timeout))
    print(json.dumps(dataclasses.asdict(report)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

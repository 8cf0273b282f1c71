"""FSDP2 training on 2 gloo ranks (CPU), evaluated live: every rank submits its shards.

    python examples/train_fsdp.py --steps 30 --eval-every 10          # starts 2 ranks itself
    torchrun --nproc-per-node 2 examples/train_fsdp.py --workdir DIR  # or under torchrun

The model is sharded with ``fully_shard``; at an eval step every rank calls
``submit(step, model=model)`` (a collective call, the same steps on every rank). Each rank
copies only its local shards, so the stall is one local copy and nothing is gathered; the
snapshot is assembled off the training thread, each rank writing its own byte ranges into the
files. The evaluating rank (``--eval-rank``, default 0) loads it back with transformers,
scores it and prints it; the other ranks record nothing. ``--eval-hf-dir`` must be a path
every rank sees (a shared filesystem across nodes).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import socket
import sys
import tempfile

import tiny_lm
import torch
import torch.distributed as dist
import transformers
from torch.distributed.fsdp import fully_shard

from actorsys import EvalConfig, MemorySink
from bridge import EvalBridge

WORLD = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--eval-every", type=int, default=10, metavar="K")
    parser.add_argument("--workdir", help="where the base checkpoint and snapshots go (shared)")
    parser.add_argument("--results", help="the evaluating rank writes its outcomes here (JSON)")
    EvalConfig.add_arguments(parser)
    return parser.parse_args(argv)


def read_set_up(args: argparse.Namespace) -> tuple[object, object, EvalConfig]:
    """The tokenizer, model config and EvalConfig rank 0 set up in the shared workdir."""
    base = os.path.join(args.workdir, "base")
    overrides: dict[str, object] = {"base_checkpoint": base}
    if args.eval_hf_dir is None and args.save_hf is None:
        overrides["hf_dir"] = os.path.join(args.workdir, "staging")
    tokenizer = transformers.AutoTokenizer.from_pretrained(base)
    model_config = transformers.LlamaConfig.from_pretrained(base)
    return tokenizer, model_config, EvalConfig.from_args(args, **overrides)


def train(rank: int, world: int, init: str, args: argparse.Namespace) -> int:
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    transformers.utils.logging.disable_progress_bar()
    if rank == 0:
        tiny_lm.set_up(args)  # writes the base checkpoint (config, tokenizer) once
    dist.barrier()
    tokenizer, model_config, config = read_set_up(args)
    model = tiny_lm.new_model(model_config)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    inputs = tiny_lm.batch(tokenizer, tiny_lm.TRAIN_TEXTS)
    evaluating = rank == config.eval_rank
    sink = tiny_lm.PrintSink() if evaluating else MemorySink()
    with EvalBridge(config, eval_fn=tiny_lm.PerplexityEval(), sink=sink) as evaluation:
        evaluation.prepare(model=model)
        for step in range(1, args.steps + 1):
            loss = tiny_lm.train_step(model, optimizer, inputs)
            evaluation.note_step(step)
            if step % args.eval_every == 0:
                admitted = evaluation.submit(step, model=model)
                if evaluating:
                    print(f"step {step:>4}: train loss {loss:.3f}, eval point "
                          f"{'submitted' if admitted else 'not admitted'}", flush=True)
        evaluation.drain(timeout=120)
        report = evaluation.close()
    if evaluating:
        summary = sink.summary() if isinstance(sink, tiny_lm.PrintSink) else ""
        print(f"rank {rank} done: {summary}; close clean: {report.clean}", flush=True)
        if args.results:
            with open(args.results, "w", encoding="utf-8") as f:
                json.dump({"outcomes": [dataclasses.asdict(o) for o in sink.outcomes],
                           "close": dataclasses.asdict(report)}, f, default=repr)
    else:
        assert not sink.outcomes
    dist.destroy_process_group()
    return 0 if report.clean else 1


def _spawned(rank: int, init: str, args: argparse.Namespace) -> None:
    code = train(rank, WORLD, init, args)
    if code:
        sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "RANK" in os.environ:  # under torchrun
        if args.workdir is None:
            raise SystemExit("under torchrun, pass --workdir (a directory every rank sees)")
        return train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://", args)
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="actorsys-fsdp-")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(
        _spawned, args=(f"tcp://127.0.0.1:{port}", args), nprocs=WORLD, join=True
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

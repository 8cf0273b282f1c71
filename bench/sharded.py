"""What a sharded trainer pays per eval point: the collective submit against a bare copy of
each rank's local shards, and against gathering the full state dict (what verl does).

Run: ``.venv/bin/python bench/sharded.py`` (a few minutes on 2 cores; ``--quick`` for a smoke
run). One run measures a job of 2 gloo ranks, then one of 4, on CPU: a Llama of about 70M
parameters (fp32) sharded with FSDP2's ``fully_shard``. In each job, per rank, with medians
over repetitions (the ranks drain between points, so every point is warm):

1. the warm stall of ``EvalBridge.submit(step, model=model)`` on that rank;
2. the floor: a bare copy of that rank's local shards into reused CPU buffers;
3. ``get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
   cpu_offload=True))``, the gather of the whole model every rank takes part in.

Prints a table per job and the ratios against their targets: stall / copy <= 1.2, stall /
gather <= 0.5 on 2 ranks (and falling with more ranks, since each rank copies 1/N of the
weights while the gather moves all of them).
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from actorsys import CheckpointEvalFn, EvalConfig, RolloutFnEvalOutput  # noqa: E402


class NoEval(CheckpointEvalFn):
    runtime = "thread"

    def evaluate_checkpoint(self, checkpoint_dir: str, input: Any) -> RolloutFnEvalOutput:
        return RolloutFnEvalOutput(data={}, metrics={})


def build_model(quick: bool) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    hidden, layers = (256, 2) if quick else (768, 6)
    config = LlamaConfig(
        vocab_size=32000, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
        num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=2,
        head_dim=64, tie_word_embeddings=True,
    )
    model = AutoModelForCausalLM.from_config(config)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def local_shards(model: torch.nn.Module) -> list[torch.Tensor]:
    from torch.distributed.tensor import DTensor

    seen: set[int] = set()
    shards = []
    for value in model.state_dict(keep_vars=True).values():
        if id(value) in seen:
            continue
        seen.add(id(value))
        shards.append(value.to_local() if isinstance(value, DTensor) else value)
    return shards


def timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_rank(rank: int, world: int, init: str, hf_dir: str, repeats: int, quick: bool) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from bridge import EvalBridge

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=600),
    )
    model = build_model(quick)
    shards = local_shards(model)
    buffers = [torch.empty_like(t) for t in shards]
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    config = EvalConfig(hf_dir=hf_dir, keep_snapshots=0, max_in_flight=2, close_timeout=120)
    stalls, copies, gathers = [], [], []
    with EvalBridge(config, eval_fn=NoEval()) as ev:
        ev.prepare(model=model)
        for step in range(repeats + 1):
            dist.barrier()
            stall = timed(lambda: ev.submit(step, model=model))  # noqa: B023 - called at once
            ev.drain(timeout=300)
            dist.barrier()
            copy = timed(lambda: [b.copy_(t) for b, t in zip(buffers, shards, strict=True)])
            dist.barrier()
            gather = timed(lambda: get_model_state_dict(model, options=options))
            if step:  # the first point warms everything up
                stalls.append(stall)
                copies.append(copy)
                gathers.append(gather)
    row = (rank, statistics.median(stalls), statistics.median(copies), statistics.median(gathers),
           sum(t.numel() * t.element_size() for t in shards))
    rows: list[Any] = [None] * world
    dist.all_gather_object(rows, row)
    if rank == 0:
        print(f"\n{world} ranks ({repeats} warm points each, medians):")
        print(f"{'rank':>4} {'local MB':>9} {'stall ms':>9} {'copy ms':>8} {'gather ms':>10} "
              f"{'stall/copy':>11} {'stall/gather':>13}")
        for r, stall, copy, gather, nbytes in rows:
            print(f"{r:>4} {nbytes / 1e6:>9.1f} {stall * 1e3:>9.1f} {copy * 1e3:>8.1f} "
                  f"{gather * 1e3:>10.1f} {stall / copy:>11.2f} {stall / gather:>13.3f}")
        worst_copy = max(stall / copy for _, stall, copy, _, _ in rows)
        worst_gather = max(stall / gather for _, stall, _, gather, _ in rows)
        print(f"worst stall/copy {worst_copy:.2f} (goal <= 1.2); worst stall/gather "
              f"{worst_gather:.3f} (goal <= 0.5 on 2 ranks, falling with more)", flush=True)
    dist.destroy_process_group()


def run_job(world: int, repeats: int, quick: bool) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="actorsys-bench-sharded-") as hf_dir:
        torch.multiprocessing.spawn(
            run_rank, args=(world, f"tcp://127.0.0.1:{port}", hf_dir, repeats, quick),
            nprocs=world, join=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small model, few repetitions")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--worlds", default="2,4", help="the job sizes to run, comma-separated")
    args = parser.parse_args()
    repeats = args.repeats or (2 if args.quick else 5)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for world in (int(w) for w in args.worlds.split(",")):
        run_job(world, repeats, args.quick)


if __name__ == "__main__":
    main()

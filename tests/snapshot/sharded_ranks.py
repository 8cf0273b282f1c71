"""The body of one rank of a real ``torch.distributed`` job (gloo, CPU) for the sharded tests:
a tiny Llama sharded with FSDP2's ``fully_shard``, trained a few steps, submitted to an
``EvalBridge`` on every rank.

The job runs one case or several in turn (``tied,untied``: both models in the same ranks, each
through its own bridge). Each rank writes what it saw in a case to ``<out>/<case>/rank<r>.json``;
in the ``tied`` and ``untied`` cases the evaluating rank also writes, for every submitted step,
the reference: ``save_pretrained`` of the unsharded model holding the same weights (gathered
only for the test, after the submit) into ``<out>/<case>/reference/<step>``.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from actorsys import CheckpointEvalFn, EvalConfig, MemorySink, RolloutFnEvalOutput

VOCAB = 255
"""Not divisible by 2 or 4: uneven shards of the embeddings and the head."""


class CountingEval(CheckpointEvalFn):
    runtime = "thread"

    def evaluate_checkpoint(self, checkpoint_dir: str, input: Any) -> RolloutFnEvalOutput:
        files = sorted(os.listdir(checkpoint_dir))
        return RolloutFnEvalOutput(data={"files": files}, metrics={"eval/files": float(len(files))})


def tiny_sharded_llama(*, tied: bool) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=130,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        tie_word_embeddings=tied,
    )
    model = AutoModelForCausalLM.from_config(config)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed + dist.get_rank())
    ids = torch.randint(0, VOCAB, (2, 12), generator=generator)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def save_reference(model: torch.nn.Module, directory: str, *, tied: bool) -> None:
    """``save_pretrained`` of the unsharded model with the sharded model's weights (a
    collective: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoModelForCausalLM

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        config = model.config  # type: ignore[attr-defined]
        plain = AutoModelForCausalLM.from_config(config)
        plain.load_state_dict(full)
        plain.save_pretrained(directory, is_main_process=True)


def run_rank(rank: int, world: int, init: str, out: str, cases: str, steps: int) -> None:
    timeout = datetime.timedelta(seconds=60)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timeout)
    for case in cases.split(","):
        run_case(rank, os.path.join(out, case), case, steps)
    if not cases.startswith("kill"):
        dist.destroy_process_group()  # with a peer dead, gloo would wait out its own timeout


def run_case(rank: int, out: str, case: str, steps: int) -> None:
    from bridge import EvalBridge

    os.makedirs(out, exist_ok=True)
    tied = case != "untied"
    record: dict[str, Any] = {"rank": rank, "submits": {}, "outcomes": [], "errors": []}
    model = tiny_sharded_llama(tied=tied)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    collective_timeout = 4.0 if case.startswith("kill") else 60.0
    config = EvalConfig(
        hf_dir=os.path.join(out, "hf"), keep_snapshots=steps, max_in_flight=2,
        collective_timeout=collective_timeout, close_timeout=20.0,
    )
    sink = MemorySink()
    if case == "kill-contributor" and rank == 1:
        import actorsys._core.collective.contribution as contribution

        def die(*args: Any, **kwargs: Any) -> None:
            os._exit(17)

        contribution.write_pieces = die  # type: ignore[assignment]
    # Every rank opens its bridge at once: the ranks meet there within collective_timeout,
    # which the kill cases keep short, and a rank slow to build its model on a busy machine
    # would miss the meeting.
    dist.barrier()
    started = time.monotonic()
    with EvalBridge(config, eval_fn=CountingEval(), sink=sink) as ev:
        ev.prepare(model=model)
        for step in range(1, steps + 1):
            train_step(model, optimizer, seed=step)
            if case == "kill-evaluator" and rank == 0 and step == steps:
                os._exit(17)
            record["submits"][step] = ev.submit(step, model=model)
            if case in ("tied", "untied"):
                save_reference(model, os.path.join(out, "reference", str(step)), tied=tied)
        report = ev.drain(timeout=60)
        record["drain"] = {"settled": report.settled, "pending": report.pending}
    record["seconds"] = time.monotonic() - started
    record["outcomes"] = [
        {"step": o.step, "status": o.status, "reason": o.reason, "error": (o.data or {}).get("error")}
        for o in sink.outcomes
    ]
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(record, f)


if __name__ == "__main__":
    rank_, world_, init_, out_, cases_, steps_ = sys.argv[1:]
    run_rank(int(rank_), int(world_), init_, out_, cases_, int(steps_))

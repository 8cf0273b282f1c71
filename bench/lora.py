"""What a LoRA point costs the trainer, against a point of the same model trained in full.

Run: ``.venv/bin/python bench/lora.py`` (about a minute on 2 cores; ``--quick`` for a smoke
run; ``--threads 1`` on a machine whose cores other processes share). Two copies of one Llama
(same config and seed) side by side in one process, each with its own supervisor, both
prepared at start: the plain model, and the same model under peft LoRA (r=8 on q_proj and
v_proj). Each repetition takes an optimizer step on what trains (everything for the plain
model, the adapters for LoRA), then times ``submit(step, model=...)`` on each, in
alternating order, waiting for one export before the other submit. A submit of the LoRA
model copies the adapters; its frozen base was copied once by ``prepare``, and the merge
runs in the export thread. Prints the medians over
the repetitions after the first, the ratio against its goal (<= 0.1), and how many bytes were
ever copied into the kept base.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import torch
import trio
from export import CountFiles  # bench/export.py, beside this script
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel

from actorsys import EvalConfig, EvalSupervisor, MemorySink
from actorsys.outcome import EXPORT_TIME_SECONDS

MB = 1000**2
GOAL = 0.1


def llama(quick: bool) -> PreTrainedModel:
    hidden, layers, vocab, intermediate = (256, 2, 8000, 688) if quick else (768, 12, 32000, 2048)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 128,
        tie_word_embeddings=False,
    )
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config)
    return model


def optimizer_step(model: torch.nn.Module, ids: torch.Tensor) -> None:
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=1e-3)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


async def timed_submit(sup: EvalSupervisor, step: int, model: Any) -> float:
    started = time.perf_counter()
    assert await sup.submit(step, model=model)
    return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="where to write (default: a temporary dir)")
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="small model, few reps")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    reps = 3 if args.quick else args.reps
    workdir = tempfile.mkdtemp(prefix="actorsys-bench-lora-", dir=args.dir)
    plain = llama(args.quick)
    adapted = get_peft_model(
        llama(args.quick), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    )
    ids = torch.randint(0, plain.config.vocab_size, (1, 16))
    sinks = {"plain": MemorySink(), "lora": MemorySink()}
    stalls: dict[str, list[float]] = {"plain": [], "lora": []}
    try:
        async with (
            EvalSupervisor.open(
                EvalConfig(hf_dir=os.path.join(workdir, "plain")),
                eval_fn=CountFiles(),
                sink=sinks["plain"],
            ) as plain_sup,
            EvalSupervisor.open(
                EvalConfig(hf_dir=os.path.join(workdir, "lora")),
                eval_fn=CountFiles(),
                sink=sinks["lora"],
            ) as lora_sup,
        ):
            started = time.perf_counter()
            await plain_sup.prepare(model=plain)
            prepare_plain = time.perf_counter() - started
            started = time.perf_counter()
            await lora_sup.prepare(model=adapted)
            prepare_lora = time.perf_counter() - started
            pairs = [("plain", plain_sup, plain), ("lora", lora_sup, adapted)]
            for step in range(reps + 1):
                optimizer_step(plain, ids)
                optimizer_step(adapted, ids)
                # One export at a time, so neither submit competes with the other's write;
                # the order alternates.
                for name, sup, model in pairs if step % 2 else pairs[::-1]:
                    stalls[name].append(await timed_submit(sup, step, model))
                    await sup.drain()
            buffers = lora_sup.statistics().buffers
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for sink in sinks.values():
        assert all(o.ok for o in sink.outcomes), sink.outcomes
    exports = {
        name: statistics.median(o.metrics[EXPORT_TIME_SECONDS] for o in sink.outcomes[1:])
        for name, sink in sinks.items()
    }
    plain_stall, lora_stall = (statistics.median(stalls[k][1:]) for k in ("plain", "lora"))
    model_bytes = sum(t.numel() * t.element_size() for t in plain.state_dict().values())
    trained = sum(p.numel() * p.element_size() for p in adapted.parameters() if p.requires_grad)
    ratio = lora_stall / plain_stall
    rows = [
        ("model (fp32, state dict)", f"{model_bytes / MB:8.1f} MB"),
        ("LoRA adapters (r=8, q_proj, v_proj)", f"{trained / MB:8.2f} MB"),
        ("plain warm stall, submit(model=)", f"{plain_stall * 1e3:8.2f} ms"),
        ("LoRA warm stall, submit(model=peft)", f"{lora_stall * 1e3:8.2f} ms"),
        ("plain export (write, fsync)", f"{exports['plain'] * 1e3:8.1f} ms"),
        ("LoRA export (merge, write, fsync)", f"{exports['lora'] * 1e3:8.1f} ms"),
        ("prepare, plain (faults buffer sets in)", f"{prepare_plain * 1e3:8.1f} ms"),
        ("prepare, LoRA (sets + copy of the base)", f"{prepare_lora * 1e3:8.1f} ms"),
        ("bytes ever copied into the kept base", f"{buffers.kept_copied_nbytes / MB:8.1f} MB"),
    ]
    width = max(len(label) for label, _ in rows)
    print(f"bench/lora.py: {reps} repetitions after a first, medians")
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")
    verdict = "ok" if ratio <= GOAL else "MISSED"
    print(f"  LoRA stall / plain stall = {ratio:.3f} (goal <= {GOAL}): {verdict}")


if __name__ == "__main__":
    trio.run(main)

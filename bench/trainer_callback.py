"""What EvalCallback costs a transformers Trainer: the mean optimizer-step time with the
callback (a point every 10 steps) against the same training without it, and the train-end
drain.

Run: ``.venv/bin/python bench/trainer_callback.py`` (a few minutes on 2 cores; ``--steps``,
``--every``, ``--repeats``, ``--threads 1`` where other processes share the cores). A Llama
of about 100 MB (fp32) trains on random tokens; the runs alternate (without, with, without,
with...) in one process so that load from other processes falls on both alike. The eval fn
reads each snapshot's safetensors header in a worker thread (what is measured is the
pipeline around it, not an evaluation). Step time is the wall time between consecutive
``on_step_end`` events, the first steps left out (warm-up); the drain is the time
``on_train_end`` of the callback takes (drain, then close).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import PrinterCallback

from actorsys import CheckpointEvalFn, EvalConfig, MemorySink, RolloutFnEvalInput, RolloutFnEvalOutput
from actorsys.integrations.transformers import EvalCallback

WARMUP_STEPS = 3


class HeaderEval(CheckpointEvalFn):
    """Counts the tensors of a snapshot from its safetensors headers (no weights read)."""

    runtime = "thread"

    def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> RolloutFnEvalOutput:
        count = 0
        for path in Path(checkpoint_dir).glob("*.safetensors"):
            with safe_open(str(path), framework="pt") as f:
                count += len(list(f.keys()))
        return RolloutFnEvalOutput(data={}, metrics={"eval/tensors": float(count)})


class StepClock(TrainerCallback):
    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.ends.append(time.perf_counter())

    def step_times(self) -> list[float]:
        """The time of each step after the warm-up, in step order (step WARMUP_STEPS + 2 on)."""
        return [b - a for a, b in zip(self.ends[WARMUP_STEPS:], self.ends[WARMUP_STEPS + 1:], strict=False)]


def at_points(times: list[float], every: int) -> tuple[list[float], list[float]]:
    """``times`` split into the steps that submitted a point (the copy) and the others."""
    first_step = WARMUP_STEPS + 2
    at = [t for i, t in enumerate(times) if (first_step + i) % every == 0]
    return at, [t for i, t in enumerate(times) if (first_step + i) % every]


class TimedEvalCallback(EvalCallback):
    """EvalCallback, with the time its train end (drain and close) takes."""

    train_end_seconds = 0.0

    def on_train_end(self, *args: Any, **kwargs: Any) -> None:
        started = time.perf_counter()
        super().on_train_end(*args, **kwargs)
        self.train_end_seconds = time.perf_counter() - started


def model_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=1376,
                       num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=8,
                       max_position_embeddings=128, tie_word_embeddings=False)


def rows(count: int, length: int) -> list[dict[str, list[int]]]:
    generator = torch.Generator().manual_seed(0)
    data = []
    for _ in range(count):
        ids = torch.randint(0, 8000, (length,), generator=generator).tolist()
        data.append({"input_ids": ids, "attention_mask": [1] * length, "labels": ids})
    return data


def train(
    root: Path, steps: int, every: int | None, run: int
) -> tuple[list[float], TimedEvalCallback | None, MemorySink]:
    torch.manual_seed(0)
    model = LlamaForCausalLM(model_config())
    clock, sink = StepClock(), MemorySink()
    callbacks: list[Any] = []
    callback = None
    if every is not None:
        base = root / "base"
        if not base.exists():
            model_config().save_pretrained(base)
        config = EvalConfig(hf_dir=root / f"staging-{run}", base_checkpoint=base, keep_snapshots=1)
        callback = TimedEvalCallback(config, eval_fn=HeaderEval(), every=every, sink=sink)
        callbacks.append(callback)
    callbacks.append(clock)
    args = TrainingArguments(
        output_dir=str(root / "out"), max_steps=steps, per_device_train_batch_size=2,
        learning_rate=1e-4, logging_steps=1000, save_strategy="no", report_to="none",
        use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=rows(64, 16), callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return clock.step_times(), callback, sink


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (1 on cores other processes share)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    size = sum(p.numel() * p.element_size() for p in LlamaForCausalLM(model_config()).parameters())
    print(f"model: {size / 1e6:.0f} MB fp32; {args.steps} steps, a point every {args.every}, "
          f"{args.repeats} runs each, alternating; torch threads {torch.get_num_threads()}")
    plain: list[float] = []
    evaluated: list[float] = []
    drains: list[float] = []
    with tempfile.TemporaryDirectory(prefix="actorsys-bench-trainer-") as tmp:
        root = Path(tmp)
        for run in range(args.repeats):
            times, _, _ = train(root, args.steps, None, run)
            plain.extend(times)
            times, callback, sink = train(root, args.steps, args.every, run)
            evaluated.extend(times)
            assert callback is not None
            drains.append(callback.train_end_seconds)
            ok = sorted(o.step for o in sink.outcomes if o.ok)
            print(f"run {run}: plain {statistics.mean(plain[-len(times):]) * 1e3:7.1f} ms/step, "
                  f"with EvalCallback {statistics.mean(times) * 1e3:7.1f} ms/step, "
                  f"train-end drain {callback.train_end_seconds:5.2f} s, ok points {ok}")
    at, between = at_points(evaluated, args.every)
    plain_at, plain_between = at_points(plain, args.every)
    print(f"steps that submit a point: {statistics.mean(at) * 1e3:.1f} ms (without the callback "
          f"{statistics.mean(plain_at) * 1e3:.1f} ms); the other steps: "
          f"{statistics.mean(between) * 1e3:.1f} ms ({statistics.mean(plain_between) * 1e3:.1f} ms)")
    ratio = statistics.mean(evaluated) / statistics.mean(plain)
    median_ratio = statistics.median(evaluated) / statistics.median(plain)
    print(f"mean optimizer step: without {statistics.mean(plain) * 1e3:.1f} ms, with "
          f"{statistics.mean(evaluated) * 1e3:.1f} ms (median {statistics.median(plain) * 1e3:.1f} / "
          f"{statistics.median(evaluated) * 1e3:.1f} ms)")
    print(f"ratio with/without: {ratio:.3f} of the means, {median_ratio:.3f} of the medians "
          "(goal <= 1.05)")
    print(f"train-end drain (drain + close): mean {statistics.mean(drains):.2f} s, "
          f"max {max(drains):.2f} s")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()

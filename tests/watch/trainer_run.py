"""A real ``transformers.Trainer`` run that saves ``checkpoint-N`` directories as users' runs
do: a tiny Llama (random weights, the tests' tokenizer) trained a few steps on CPU."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import Trainer, TrainingArguments

from tests.models import CORPUS, make_tokenizer, random_model, tiny_config


def train_with_checkpoints(output_dir: Path, *, steps: int, save_steps: int) -> list[str]:
    """Train ``steps`` optimizer steps, saving every ``save_steps``; the checkpoint names."""
    tokenizer = make_tokenizer()
    model = random_model(tiny_config(len(tokenizer), tokenizer.eos_token_id), seed=0).train()
    rows = [tokenizer(line)["input_ids"][:12] for line in CORPUS]
    length = min(len(ids) for ids in rows)
    data = [{"input_ids": torch.tensor(ids[:length]), "labels": torch.tensor(ids[:length])}
            for ids in rows]
    args = TrainingArguments(
        output_dir=os.fspath(output_dir),
        max_steps=steps,
        save_strategy="steps",
        save_steps=save_steps,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        use_cpu=True,
        report_to=[],
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    Trainer(model=model, args=args, train_dataset=data, processing_class=tokenizer).train()  # type: ignore[arg-type]
    return sorted((p.name for p in output_dir.iterdir() if p.name.startswith("checkpoint-")),
                  key=lambda name: int(name.split("-")[1]))

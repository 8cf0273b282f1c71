"""EvalCallback inside TRL's trainers on a tiny model (CPU; GRPO generates with transformers,
use_vllm=False): the same points and log_history rows as under a plain Trainer."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer  # noqa: E402

from actorsys import EvalConfig, MemorySink  # noqa: E402
from actorsys.integrations.transformers import EvalCallback  # noqa: E402
from tests.integrations.trainer_models import KeepsSnapshots, base_model, eval_rows  # noqa: E402
from tests.models import CORPUS, PROMPTS, make_tokenizer  # noqa: E402

pytestmark = pytest.mark.slow

COMMON = {"use_cpu": True, "report_to": "none", "save_strategy": "no", "disable_tqdm": True,
          "logging_steps": 1, "dataloader_num_workers": 0, "seed": 0}


def callback(tmp_path: Path, every: int, sink: MemorySink) -> EvalCallback:
    config = EvalConfig(hf_dir=tmp_path / "staging", base_checkpoint=tmp_path / "base")
    return EvalCallback(config, eval_fn=KeepsSnapshots(), every=every, sink=sink)


@pytest.mark.timeout(240)
def test_sft_trainer_evaluates_every_k_steps(tmp_path: Path) -> None:
    model, sink = base_model(tmp_path / "base"), MemorySink()
    data = Dataset.from_list([{"text": line} for line in CORPUS * 4])
    trainer = SFTTrainer(
        model=model, processing_class=make_tokenizer(), train_dataset=data,
        args=SFTConfig(output_dir=str(tmp_path / "out"), max_steps=10, max_length=32,
                       per_device_train_batch_size=4, learning_rate=5e-3, **COMMON),
        callbacks=[callback(tmp_path, 5, sink)],
    )
    trainer.train()

    assert sorted((o.step, o.status) for o in sink.outcomes) == [(5, "ok"), (10, "ok")]
    assert sorted(eval_rows(trainer.state.log_history)) == [5, 10]


def prompt_length(completions: list[str], **kwargs: object) -> list[float]:
    return [float(len(text)) / 32 for text in completions]


@pytest.mark.timeout(300)
def test_grpo_trainer_evaluates_every_k_steps(tmp_path: Path) -> None:
    model, sink = base_model(tmp_path / "base"), MemorySink()
    data = Dataset.from_list([{"prompt": prompt} for prompt in PROMPTS * 4])
    trainer = GRPOTrainer(
        model=model, processing_class=make_tokenizer(), reward_funcs=prompt_length,
        train_dataset=data,
        args=GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=4, use_vllm=False,
                        per_device_train_batch_size=4, num_generations=2,
                        max_completion_length=8, learning_rate=1e-3, **COMMON),
        callbacks=[callback(tmp_path, 2, sink)],
    )
    trainer.train()

    assert sorted((o.step, o.status) for o in sink.outcomes) == [(2, "ok"), (4, "ok")]
    rows = eval_rows(trainer.state.log_history)
    assert sorted(rows) == [2, 4] and all("eval/rms" in row for row in rows.values())

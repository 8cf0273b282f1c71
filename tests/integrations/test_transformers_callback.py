"""EvalCallback inside a real transformers Trainer (CPU): points every ``every`` optimizer
steps whose snapshots are the weights of that step, one log_history row per point, rows
that reach the report_to integrations (TensorBoard, offline W&B), and a train end that waits
for the last points within its budget. Wall-clock bound: real training, real threads."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")

from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from actorsys import EvalConfig, MemorySink  # noqa: E402
from actorsys.integrations.transformers import EvalCallback  # noqa: E402
from tests.integrations.trainer_models import (  # noqa: E402
    KeepsSnapshots,
    base_model,
    eval_rows,
    token_rows,
)

pytestmark = pytest.mark.slow


class KeepsWeightsAt(TrainerCallback):
    """Copies the model's weights at the end of the steps given, and notes when each ended."""

    def __init__(self, steps: tuple[int, ...]) -> None:
        self.steps = steps
        self.weights: dict[int, dict[str, Any]] = {}
        self.step_ended_at: dict[int, float] = {}

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        self.step_ended_at[state.global_step] = time.monotonic()
        if state.global_step in self.steps:
            self.weights[state.global_step] = {
                k: v.detach().clone() for k, v in model.state_dict().items()
            }


def training_args(tmp_path: Path, steps: int, **overrides: Any) -> TrainingArguments:
    return TrainingArguments(**{
        "output_dir": str(tmp_path / "out"), "max_steps": steps, "per_device_train_batch_size": 4,
        "learning_rate": 5e-3, "logging_steps": 5, "save_strategy": "no", "report_to": "none",
        "use_cpu": True, "disable_tqdm": True, "dataloader_num_workers": 0, "seed": 0,
        **overrides,
    })


def config(tmp_path: Path, **overrides: Any) -> EvalConfig:
    return EvalConfig(hf_dir=tmp_path / "staging", base_checkpoint=tmp_path / "base", **overrides)


@pytest.mark.timeout(240)
def test_points_every_ten_steps_are_the_weights_of_their_step_and_rows_of_log_history(
    tmp_path: Path,
) -> None:
    model = base_model(tmp_path / "base")
    eval_fn, keeps, sink = KeepsSnapshots(), KeepsWeightsAt((10, 20, 30)), MemorySink()
    trainer = Trainer(
        model=model, args=training_args(tmp_path, 30), train_dataset=token_rows(),
        callbacks=[EvalCallback(config(tmp_path), eval_fn=eval_fn, every=10, sink=sink), keeps],
    )
    trainer.train()

    assert [(o.step, o.status) for o in sorted(sink.outcomes, key=lambda o: o.step)] == [
        (10, "ok"), (20, "ok"), (30, "ok")
    ]
    for step in (10, 20, 30):
        snapshot, weights = eval_fn.tensors[step], keeps.weights[step]
        assert set(snapshot) == set(weights)
        for name, tensor in snapshot.items():
            assert tensor.equal(weights[name]), f"step {step}: {name} differs"
    assert not eval_fn.tensors[10]["model.norm.weight"].equal(eval_fn.tensors[30]["model.norm.weight"])
    rows = eval_rows(trainer.state.log_history)
    assert sorted(rows) == [10, 20, 30]
    for step, row in rows.items():
        assert row["eval/mean_square"] == pytest.approx(
            next(o for o in sink.outcomes if o.step == step).metrics["eval/mean_square"])
        assert row["step"] >= step
    train_rows = [row for row in trainer.state.log_history if "loss" in row]
    assert [row["step"] for row in train_rows] == [5, 10, 15, 20, 25, 30]


@pytest.mark.timeout(240)
def test_an_eval_still_running_at_train_end_lands_before_train_returns(tmp_path: Path) -> None:
    model = base_model(tmp_path / "base")
    eval_fn = KeepsSnapshots(slow_steps=(20,), slow_seconds=1.5)
    keeps = KeepsWeightsAt(())
    trainer = Trainer(
        model=model, args=training_args(tmp_path, 20), train_dataset=token_rows(),
        callbacks=[EvalCallback(config(tmp_path), eval_fn=eval_fn, every=10), keeps],
    )
    trainer.train()

    assert eval_fn.finished_at[20] > keeps.step_ended_at[20]
    rows = eval_rows(trainer.state.log_history)
    assert sorted(rows) == [10, 20]
    assert "eval/mean_square" in rows[20]


@pytest.mark.timeout(240)
def test_a_hung_eval_is_cut_within_drain_timeout_plus_the_close_budget(tmp_path: Path) -> None:
    model = base_model(tmp_path / "base")
    callback = EvalCallback(
        config(tmp_path, close_timeout=2.0), eval_fn=KeepsSnapshots(hang_steps=(10,)), every=10,
        drain_timeout=1.0,
    )
    keeps = KeepsWeightsAt(())
    trainer = Trainer(model=model, args=training_args(tmp_path, 10), train_dataset=token_rows(),
                      callbacks=[callback, keeps])
    trainer.train()
    returned = time.monotonic()

    # drain_timeout + close_timeout, and room for a loaded machine (the hang is forever).
    assert returned - keeps.step_ended_at[10] < 1.0 + 2.0 + 5.0
    assert callback.session.close_report is not None
    assert callback.session.close_report.abandoned == [10]
    assert eval_rows(trainer.state.log_history)[10]["eval/skipped_closed"] == 1


@pytest.mark.timeout(240)
def test_rows_reach_tensorboard_and_wandb_which_plots_them_against_eval_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    import wandb
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.sinks.wandb_records import history_rows, step_metrics

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "actorsys-test")
    model = base_model(tmp_path / "base")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    args = training_args(tmp_path, 20, report_to=["tensorboard", "wandb"])
    trainer = Trainer(model=model, args=args, train_dataset=token_rows(), callbacks=[
        EvalCallback(config(tmp_path), eval_fn=KeepsSnapshots(slow_steps=(20,), slow_seconds=1.0),
                     every=10)])
    trainer.train()
    run_dir = Path(wandb.run.dir).parent
    wandb.finish()

    wandb_rows = [row for row in history_rows(run_dir) if "eval/step" in row]
    assert sorted(row["eval/step"] for row in wandb_rows) == [10, 20]
    assert all("eval/mean_square" in row for row in wandb_rows)
    assert step_metrics(run_dir)["eval/mean_square"] == "eval/step"
    (events_dir,) = {p.parent for p in (tmp_path / "tb").rglob("events.out.tfevents.*")}
    events = EventAccumulator(str(events_dir))
    events.Reload()
    assert sorted(e.value for e in events.Scalars("train/eval/step")) == [10, 20]

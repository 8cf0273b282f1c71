"""The stop signal through real trainers (CPU): a transformers Trainer stops at the first
step end after the point that reached ``stop_when`` settled, a Lightning run after ``patience``
points that did not improve; each logs why once; ``every`` defaults to ``eval_interval``.

Evaluation runs beside training, so a waiter callback holds the trainer's step after a point
until that point has settled (a threading.Event the host sink sets, bounded): the step at
which training stops is then exact."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("lightning")

import lightning.pytorch as pl  # noqa: E402
import trio  # noqa: E402
from transformers import Trainer, TrainerCallback  # noqa: E402

from actorsys import (  # noqa: E402
    CheckpointEvalFn,
    ConfigError,
    EvalConfig,
    Outcome,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from actorsys.integrations import lightning as lightning_callback  # noqa: E402
from actorsys.integrations import transformers as transformers_callback  # noqa: E402
from tests.integrations.test_lightning_callback import LitLM, RecordingLogger, loader  # noqa: E402
from tests.integrations.test_transformers_callback import training_args  # noqa: E402
from tests.integrations.trainer_models import base_model, token_rows  # noqa: E402

pytestmark = pytest.mark.slow

STOP_LOG = "evaluation asks training to stop"


class Scores(CheckpointEvalFn):
    """Scores step N as ``scores(N)`` (``eval/acc``) without reading the snapshot; the steps in
    ``held`` are scored only once ``release(step)`` is called (bounded), so that their points
    cannot settle before the trainer reached the step that releases them."""

    def __init__(self, scores: dict[int, float], held: tuple[int, ...] = ()) -> None:
        self.scores = scores
        self.released = {step: threading.Event() for step in held}

    def release(self, step: int) -> None:
        self.released[step].set()

    async def evaluate_checkpoint(
        self, checkpoint_dir: str, input: RolloutFnEvalInput
    ) -> RolloutFnEvalOutput:
        step = int(input.rollout_id)
        if step in self.released:
            await trio.to_thread.run_sync(self.released[step].wait, 60)
        await trio.lowlevel.checkpoint()
        return RolloutFnEvalOutput(data={}, metrics={"eval/acc": self.scores[step]})


class SettledSteps:
    """A host sink: an event per step, set when its point settles."""

    def __init__(self) -> None:
        self.events: dict[int, threading.Event] = {}

    def event(self, step: int) -> threading.Event:
        return self.events.setdefault(step, threading.Event())

    def record(self, outcome: Outcome) -> None:
        self.event(outcome.step).set()

    def close(self) -> None:
        pass


class HoldsStep(TrainerCallback):
    """At the end of step ``at`` (after the eval callback's own step end) lets the point of
    step ``until`` be scored and waits (bounded) until it settled."""

    def __init__(self, settled: SettledSteps, scores: Scores, at: int, until: int) -> None:
        self.settled, self.scores, self.at, self.until = settled, scores, at, until

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.at:
            self.scores.release(self.until)
            assert self.settled.event(self.until).wait(60), "the point never settled"


class HoldsBatch(pl.Callback):
    def __init__(self, settled: SettledSteps, scores: Scores, at: int, until: int) -> None:
        self.settled, self.scores, self.at, self.until = settled, scores, at, until

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.at:
            self.scores.release(self.until)
            assert self.settled.event(self.until).wait(60), "the point never settled"


def stop_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(STOP_LOG)]


@pytest.mark.timeout(240)
def test_the_trainer_stops_at_the_step_after_the_threshold_point_settled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="actorsys.integrations")
    model = base_model(tmp_path / "base")
    settled = SettledSteps()
    config = EvalConfig(hf_dir=tmp_path / "staging", base_checkpoint=tmp_path / "base",
                        eval_interval=5, stop_when={"eval/acc": 0.8})
    scores = Scores({5: 0.5, 10: 0.85, 15: 0.9}, held=(10,))
    callback = transformers_callback.EvalCallback(config, eval_fn=scores, sink=settled)
    trainer = Trainer(
        model=model, args=training_args(tmp_path, 100), train_dataset=token_rows(),
        callbacks=[callback, HoldsStep(settled, scores, at=11, until=10)],
    )
    trainer.train()

    assert trainer.state.global_step == 12
    assert sorted(settled.events) == [5, 10]
    assert stop_logs(caplog) == [f"{STOP_LOG}: step 10 reached eval/acc = 0.85 >= 0.8"]


@pytest.mark.timeout(240)
def test_a_lightning_run_stops_after_patience_points_without_improvement(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="actorsys.integrations")
    model = base_model(tmp_path / "base")
    settled = SettledSteps()
    config = EvalConfig(hf_dir=tmp_path / "staging", base_checkpoint=tmp_path / "base",
                        eval_interval=3, best_metric="eval/acc", patience=2)
    scores = Scores({3: 0.5, 6: 0.4, 9: 0.5, 12: 0.9}, held=(9,))
    callback = lightning_callback.EvalCallback(config, eval_fn=scores, sink=settled)
    run = pl.Trainer(
        max_steps=100, accelerator="cpu", devices=1, logger=RecordingLogger(),
        callbacks=[callback, HoldsBatch(settled, scores, at=10, until=9)], enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=5,
    )
    run.fit(LitLM(model), loader())

    assert run.global_step == 11
    assert sorted(settled.events) == [3, 6, 9]
    assert len(stop_logs(caplog)) == 1 and "patience 2" in stop_logs(caplog)[0]


def test_a_callback_without_every_or_eval_interval_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="^every: pass every="):
        transformers_callback.EvalCallback(EvalConfig(hf_dir=tmp_path), eval_fn=Scores({}))
    with pytest.raises(ConfigError, match="^every: pass every="):
        lightning_callback.EvalCallback(EvalConfig(hf_dir=tmp_path), eval_fn=Scores({}))

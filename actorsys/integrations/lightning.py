"""``EvalCallback`` for Lightning (``lightning.pytorch.Trainer``).

Example::

    from actorsys import EvalConfig
    from actorsys.integrations.lightning import EvalCallback

    class LitLM(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = AutoModelForCausalLM.from_pretrained(base)   # what is exported
        ...

    trainer = lightning.Trainer(max_steps=1000, callbacks=[
        EvalCallback(EvalConfig(hf_dir="/dev/shm/eval", base_checkpoint=base),
                     eval_fn=MyEval(), every=100)])
    trainer.fit(LitLM(), data)

The snapshot is the LightningModule's transformers model (its attribute ``model_attr``, or
the module itself when it is a ``PreTrainedModel``), so its keys are the Hugging Face
model's and every engine loads it as it is. Each settled point goes to every logger of the
trainer at its own step: ``logger.log_metrics(row, step=point_step)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

try:
    import lightning.pytorch as pl
except ImportError as exc:
    raise ImportError(
        "actorsys.integrations.lightning needs lightning: pip install 'actorsys[lightning]'"
    ) from exc
from transformers import PreTrainedModel

from actorsys._errors import ConfigError
from actorsys.config import EvalConfig
from actorsys.integrations._session import TrainingSession
from actorsys.sinks import Sink
from actorsys.sinks.rows import log_row


class EvalCallback(pl.Callback):
    """Non-blocking evaluation every ``every`` optimizer steps (``trainer.global_step``; by
    default ``config.eval_interval``) of a Lightning run.

    At train start it opens an :class:`~bridge.EvalBridge` and prepares it with the model;
    at the end of each training batch whose global step is a new multiple of ``every`` it
    submits the model, on every process; at train end it drains for at most
    ``drain_timeout`` seconds and closes within ``config.close_timeout``, logging what
    settled before ``fit`` returns. A run that ends in an exception closes at once. The
    trainer's thread blocks on the copy of the weights at a point, and at train end on the
    drain and the close. Once the stop signal holds (``config.stop_when``, ``config.patience``)
    it sets ``trainer.should_stop``, and logs why once.
    """

    def __init__(
        self,
        config: EvalConfig,
        *,
        eval_fn: Any,
        fleet: Any = None,
        every: int | None = None,
        sink: Sink | Sequence[Sink] | None = None,
        drain_timeout: float = 600.0,
        model_attr: str = "model",
    ) -> None:
        self.session = TrainingSession(
            config, eval_fn=eval_fn, fleet=fleet, every=every, sink=sink,
            drain_timeout=drain_timeout,
        )
        self.model_attr = model_attr

    def exported_model(self, pl_module: pl.LightningModule) -> torch.nn.Module:
        """The transformers model of ``pl_module`` that each point exports."""
        inner = getattr(pl_module, self.model_attr, None)
        if isinstance(inner, PreTrainedModel):
            return inner
        if isinstance(pl_module, PreTrainedModel):
            return pl_module
        raise ConfigError(
            "model_attr",
            f"{type(pl_module).__name__}.{self.model_attr} is "
            f"{type(inner).__name__ if inner is not None else 'missing'}, not a transformers "
            "PreTrainedModel; pass model_attr= naming the attribute that holds it",
        )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.session.open(self.exported_model(pl_module))

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:
        self.session.step(trainer.global_step, self.exported_model(pl_module))
        self._publish(trainer)
        if self.session.should_stop():
            trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        try:
            self.session.finish()
        finally:
            self._publish(trainer)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.session.abort()

    def _publish(self, trainer: pl.Trainer) -> None:
        for outcome in self.session.settled.take():
            if not trainer.is_global_zero:
                continue
            row = log_row(outcome)
            for logger in trainer.loggers:
                logger.log_metrics(row, step=outcome.step)

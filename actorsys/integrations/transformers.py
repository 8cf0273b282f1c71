"""``EvalCallback`` for ``transformers.Trainer`` and every TRL trainer (SFT, DPO, GRPO...).

Example::

    from actorsys import EvalConfig
    from actorsys.integrations.transformers import EvalCallback

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[
        EvalCallback(EvalConfig(hf_dir="/dev/shm/eval"), eval_fn=MyEval(), every=100)])
    trainer.train()      # returns once the last points have landed in trainer.state.log_history

Where the scores go. ``Trainer.log`` appends its row to ``state.log_history`` before any
callback's ``on_log`` runs, so a callback cannot add to the trainer's own rows. Each settled
point is therefore a row of its own: the callback appends it to ``state.log_history`` (its
metrics, ``eval/step`` = the point's step, ``step`` = the trainer's step when it landed) and
hands it to the ``on_log`` of every other callback of the trainer, which is how ``report_to``
integrations receive rows. It finds those callbacks at train begin in the
``CallbackHandler`` delivering the event, and moves itself to the front of that list, so that
at train end it drains before the integrations close their writers. W&B plots against
``train/global_step``, which only grows, so a late point would sit at the wrong step: the
W&B integration gets the rows directly into its run, each metric defined against
``eval/step``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import CallbackHandler

from actorsys._errors import ConfigError
from actorsys.config import EvalConfig
from actorsys.integrations._session import TrainingSession
from actorsys.sinks import Sink
from actorsys.sinks.rows import WandbEvalAxis, log_row

log = logging.getLogger("actorsys.integrations")

HANDLER_SEARCH_DEPTH = 8
"""How many frames up the ``CallbackHandler`` delivering ``on_train_begin`` is looked for."""


class EvalCallback(TrainerCallback):
    """Non-blocking evaluation every ``every`` optimizer steps of a transformers ``Trainer``.

    At train begin it opens an :class:`~bridge.EvalBridge` (``config``, ``eval_fn``,
    ``fleet``, ``sink`` as there) and prepares it with the model, so the first point costs a
    copy into mapped memory. At the end of every optimizer step whose number is a multiple of
    ``every`` (by default ``config.eval_interval``) it submits the model, on every process (a
    sharded model's submit is collective). Once the stop signal holds (``config.stop_when``,
    ``config.patience``: :attr:`bridge.EvalBridge.should_stop`) it sets
    ``control.should_training_stop``, and logs why once. At train end it drains for at most
    ``drain_timeout`` seconds and closes within ``config.close_timeout``; the points settled
    by then are logged before ``train()`` returns, those cut off as ``eval/skipped_closed``.

    The trainer's thread blocks on the copy of the weights at a point (and on a free slot
    under ``overflow="backpressure"``), and at train end on the drain and the close.
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
    ) -> None:
        self.session = TrainingSession(
            config, eval_fn=eval_fn, fleet=fleet, every=every, sink=sink,
            drain_timeout=drain_timeout,
        )
        self._handler: CallbackHandler | None = None
        self._wandb_axis = WandbEvalAxis()

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        model: torch.nn.Module | None = None, **kwargs: Any,
    ) -> None:
        self._handler = self._take_front_of_handler()
        if model is None:
            raise ConfigError("model", "the trainer passed no model to EvalCallback at train begin")
        self.session.open(model)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        model: torch.nn.Module | None = None, **kwargs: Any,
    ) -> None:
        if model is not None:
            self.session.step(state.global_step, model)
        self._publish(args, state, control)
        if self.session.should_stop():
            control.should_training_stop = True

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        try:
            self.session.finish()
        finally:
            self._publish(args, state, control)

    def _take_front_of_handler(self) -> CallbackHandler | None:
        """The handler delivering this event, with this callback moved to its front.

        Moving it is safe during the delivery: the handler iterates its list by index, and
        every callback before this one has already run (positions after it do not change).
        """
        frame: FrameType | None = sys._getframe(1)
        for _ in range(HANDLER_SEARCH_DEPTH):
            if frame is None:
                break
            handler = frame.f_locals.get("self")
            if isinstance(handler, CallbackHandler) and any(c is self for c in handler.callbacks):
                callbacks = handler.callbacks
                index = next(i for i, c in enumerate(callbacks) if c is self)
                callbacks.insert(0, callbacks.pop(index))
                return handler
            frame = frame.f_back
        log.warning("EvalCallback: no CallbackHandler delivers on_train_begin; eval points "
                    "go to trainer.state.log_history only, not to the report_to integrations")
        return None

    def _publish(self, args: TrainingArguments, state: TrainerState, control: TrainerControl) -> None:
        """Log each point settled since the last call as its own row."""
        for outcome in self.session.settled.take():
            row = log_row(outcome)
            state.log_history.append({**row, "step": state.global_step})
            if state.is_world_process_zero and self._handler is not None:
                self._deliver(self._handler, args, state, control, row)

    def _deliver(
        self, handler: CallbackHandler, args: TrainingArguments, state: TrainerState,
        control: TrainerControl, row: dict[str, float],
    ) -> None:
        """Hand ``row`` to the other callbacks' ``on_log`` as the handler would (same
        keyword arguments); a callback that raises is logged and skipped."""
        from transformers.integrations import WandbCallback

        should_log = control.should_log
        for callback in handler.callbacks:
            if callback is self:
                continue
            try:
                if isinstance(callback, WandbCallback):
                    self._log_to_wandb(row)
                    continue
                callback.on_log(
                    args, state, control, logs=dict(row), model=handler.model,
                    processing_class=handler.processing_class, optimizer=handler.optimizer,
                    lr_scheduler=handler.lr_scheduler, train_dataloader=handler.train_dataloader,
                    eval_dataloader=handler.eval_dataloader,
                )
            except Exception:
                log.exception("%s.on_log failed on an eval row", type(callback).__name__)
        control.should_log = should_log

    def _log_to_wandb(self, row: dict[str, float]) -> None:
        """Log ``row`` into the run the W&B integration started, every metric against
        ``eval/step`` (:class:`~actorsys.sinks.rows.WandbEvalAxis`)."""
        import wandb

        run = wandb.run
        if run is None:
            return
        self._wandb_axis.log(run, row)

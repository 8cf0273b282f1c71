"""WandbSink: eval metrics in a Weights & Biases run, against their own ``eval/step`` axis.

A trainer's wandb step only grows, so a point that lands after later training steps were
logged would be dropped if logged at its step. Each eval metric is therefore defined against
``eval/step`` (the step the weights came from) and logged with it. Needs the ``wandb`` extra;
it is imported when the sink is made. ``mode="offline"`` works without a network.
"""

from __future__ import annotations

from typing import Any

from actorsys.outcome import Outcome
from actorsys.sinks.rows import SKIP_REASON, WandbEvalAxis, log_row, skip_reason


class WandbSink:
    """Starts a run with ``wandb.init(**wandb_init_kwargs)`` and logs each outcome's row
    (:func:`actorsys.sinks.rows.log_row`) against ``eval/step`` = ``outcome.step``; a skipped
    point also logs ``eval/skip_reason``.

    The constructor blocks on ``wandb.init``; ``record`` hands the row to wandb's own
    background service. ``close()`` finishes the run (blocks until wandb has written it).
    """

    def __init__(self, **wandb_init_kwargs: Any) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ImportError("WandbSink needs wandb: pip install 'actorsys[wandb]'") from exc
        self.run: Any = wandb.init(**wandb_init_kwargs)
        self._axis = WandbEvalAxis()
        self._axis.claim_prefix(self.run)
        self._closed = False

    def __repr__(self) -> str:
        return f"WandbSink(run={getattr(self.run, 'id', None)!r})"

    def record(self, outcome: Outcome) -> None:
        row: dict[str, float | str] = dict(log_row(outcome))
        reason = skip_reason(outcome)
        if reason is not None:
            row[SKIP_REASON] = reason
        self._axis.log(self.run, row)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.run.finish()

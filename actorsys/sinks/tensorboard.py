"""TensorBoardSink: eval metrics as TensorBoard scalars at the step their weights came from.

Needs the ``tensorboard`` extra; it is imported when the sink is made, not with actorsys.
"""

from __future__ import annotations

import os
from typing import Any

from actorsys.outcome import Outcome
from actorsys.sinks.rows import EVAL_STEP, SKIP_REASON, log_row, skip_reason


class TensorBoardSink:
    """Writes each outcome's row (:func:`actorsys.sinks.rows.log_row`: every numeric metric and,
    for a skipped point, ``eval/skipped_<reason>`` = 1) as scalars at ``outcome.step`` into an
    event file under ``logdir``; a skipped point also gets a text entry ``eval/skip_reason``.
    A point that lands late is written at its own step, so nothing is dropped.

    ``record`` only queues the event: TensorBoard's writer thread writes it and flushes every
    ``flush_secs`` seconds. ``close()`` flushes and closes the file (whoever made the sink
    closes it; the supervisor does not).
    """

    def __init__(self, logdir: str | os.PathLike[str], *, flush_secs: float = 5.0) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError(
                "TensorBoardSink needs tensorboard: pip install 'actorsys[tensorboard]'"
            ) from exc
        self.logdir = os.fspath(logdir)
        self._writer: Any = SummaryWriter(log_dir=self.logdir, flush_secs=flush_secs)

    def __repr__(self) -> str:
        return f"TensorBoardSink({self.logdir!r})"

    def record(self, outcome: Outcome) -> None:
        for name, value in log_row(outcome).items():
            if name != EVAL_STEP:
                self._writer.add_scalar(name, value, global_step=outcome.step)
        reason = skip_reason(outcome)
        if reason is not None:
            self._writer.add_text(SKIP_REASON, reason, global_step=outcome.step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

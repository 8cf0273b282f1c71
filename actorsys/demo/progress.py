"""The demo's live view (rich): the training step and loss, and each eval point as it lands
with its score and lag, or the reason it was skipped.

``record`` is called from the bridge's trio thread and ``train_step`` from the trainer; both
only update state under a lock (never block on the terminal). rich's own refresh thread
draws it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from actorsys.outcome import DURATION_SECONDS, LAG_STEPS, METRIC_PREFIX, Outcome


class DemoProgress:
    """A sink and a training-progress view in one; use as ``with DemoProgress(...) as view``."""

    def __init__(self, *, steps: int, score: str, console: Console) -> None:
        self.steps = steps
        self.score = score
        self.console = console
        self.outcomes: list[Outcome] = []
        self.stalls: dict[int, float] = {}
        self.step = 0
        self.loss: float | None = None
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._live = Live(console=console, refresh_per_second=4, get_renderable=self._render)

    def __enter__(self) -> DemoProgress:
        self._live.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._live.stop()
        if not self.console.is_terminal:
            self.console.line()

    def train_step(self, step: int, loss: float) -> None:
        with self._lock:
            self.step, self.loss = step, loss

    def submitted(self, step: int, stall_seconds: float) -> None:
        """How long the submit of ``step`` held up the trainer."""
        with self._lock:
            self.stalls[step] = stall_seconds

    def record(self, outcome: Outcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)

    def close(self) -> None:
        """Nothing to release (the view stops when its block is left)."""

    def _render(self) -> Group:
        with self._lock:
            step, loss, outcomes = self.step, self.loss, list(self.outcomes)
            stalls = dict(self.stalls)
        elapsed = time.monotonic() - self._started
        header = Text.assemble(
            ("training ", "bold"),
            f"step {step}/{self.steps}  ",
            f"loss {loss:.3f}  " if loss is not None else "",
            (f"{elapsed:.0f} s", "dim"),
        )
        table = Table(title="eval points, as they land", title_justify="left", expand=False)
        table.add_column("step", justify="right")
        table.add_column(self.score.removeprefix(METRIC_PREFIX), justify="right")
        table.add_column("lag (steps)", justify="right")
        table.add_column("eval (s)", justify="right")
        table.add_column("trainer stall (ms)", justify="right")
        for outcome in outcomes:
            lag = outcome.metrics.get(LAG_STEPS)
            lag_text = "" if lag is None else f"{lag:.0f}"
            stall = stalls.get(outcome.step)
            stall_text = "" if stall is None else f"{stall * 1000:.1f}"
            if outcome.ok:
                score = outcome.metrics.get(self.score)
                duration = outcome.metrics.get(DURATION_SECONDS)
                table.add_row(
                    str(outcome.step),
                    "" if score is None else f"{score:.2f}",
                    lag_text,
                    "" if duration is None else f"{duration:.2f}",
                    stall_text,
                )
            else:
                skipped = Text(f"skipped: {outcome.reason}", "yellow")
                table.add_row(str(outcome.step), skipped, lag_text, "", stall_text)
        return Group(header, table)

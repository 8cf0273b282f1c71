"""PNG plots of eval metrics by step (matplotlib, no display needed)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from actorsys.metrics_file import Point, score_metrics

MAX_LINES = 8


def plot_eval(
    points: Sequence[Point],
    png: str | os.PathLike[str],
    *,
    metrics: Sequence[str] | None = None,
    train_loss: Sequence[tuple[int, float]] = (),
    title: str = "evaluation by step",
) -> None:
    """Write ``png``: each of ``metrics`` (default: the headline scores) of the ok points by
    step, and beside it the training loss by step when ``train_loss`` is given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = sorted((p for p in points if p.ok), key=lambda p: p.step)
    names = list(metrics) if metrics is not None else score_metrics(ok)[:MAX_LINES]
    panels = 2 if train_loss else 1
    figure, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), squeeze=False)
    evals = axes[0][0]
    for name in names:
        series = [(p.step, p.metrics[name]) for p in ok if name in p.metrics]
        if series:
            evals.plot(*zip(*series, strict=True), marker="o", label=name)
    skipped = sorted({p.step for p in points if not p.ok})
    for step in skipped:
        evals.axvline(step, color="grey", alpha=0.3, linestyle=":")
    evals.set_xlabel("step")
    evals.set_title(title)
    if names:
        evals.legend(fontsize="small")
    evals.grid(alpha=0.3)
    if train_loss:
        loss = axes[0][1]
        loss.plot(*zip(*train_loss, strict=True), color="tab:red", linewidth=1)
        loss.set_xlabel("step")
        loss.set_title("training loss")
        loss.set_yscale("log")
        loss.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(os.fspath(png), dpi=100)
    plt.close(figure)

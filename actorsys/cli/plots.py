"""PNG plots of eval metrics by step (matplotlib, no display needed)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from actorsys.metrics_file import Point, score_metrics, stderr_name

MAX_LINES = 8
BAND = 1.96
"""The band drawn around a metric with a standard error: ±1.96 of it (95% for a normal mean)."""


def plot_eval(
    points: Sequence[Point],
    png: str | os.PathLike[str],
    *,
    metrics: Sequence[str] | None = None,
    train_loss: Sequence[tuple[int, float]] = (),
    title: str = "evaluation by step",
    best: tuple[int, str | None] | None = None,
) -> None:
    """Write ``png``: each of ``metrics`` (default: the headline scores) of the ok points by
    step, with a band of ±1.96 standard errors where the points carry one
    (``<metric>/stderr``), and beside it the training loss by step when ``train_loss`` is
    given. ``best``: the best point's step and the metric it is best by, marked with a star."""
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
            (line,) = evals.plot(*zip(*series, strict=True), marker="o", label=name)
            band = [(p.step, p.metrics[name], p.metrics[stderr_name(name)]) for p in ok
                    if name in p.metrics and stderr_name(name) in p.metrics]
            if band:
                steps, values, errors = zip(*band, strict=True)
                evals.fill_between(steps, [v - BAND * e for v, e in zip(values, errors, strict=True)],
                                   [v + BAND * e for v, e in zip(values, errors, strict=True)],
                                   color=line.get_color(), alpha=0.2, linewidth=0,
                                   label=f"{name} ±{BAND} stderr")
    if best is not None:
        marked = [p for p in ok if p.step == best[0]]
        metric = best[1] if best[1] is not None else (names[0] if names else None)
        if marked and metric is not None and metric in marked[0].metrics:
            evals.plot([best[0]], [marked[0].metrics[metric]], marker="*", markersize=16,
                       color="gold", markeredgecolor="black", linestyle="none",
                       label=f"best: step {best[0]}", zorder=5)
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

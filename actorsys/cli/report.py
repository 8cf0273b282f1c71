"""'actorsys report METRICS.jsonl [--png FILE] [--compare A B]': a table of the points of a
metrics file ('demo' and 'watch' write one; so does 'JsonlSink'; of a step written twice,
the last line), each score as
'value ± stderr' where its standard error is known, the best point marked; a plot of the eval
metrics by step with a band of ±1.96 standard errors; or, with --compare, whether step B
differs from step A beyond chance (a paired test per dataset over the prompts both scored).
The tables go to stdout."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence

from actorsys.cli._conventions import EXIT_USAGE, add_log_level, existing_file, setup_logging
from actorsys.cli.compare import Comparison, compare
from actorsys.metrics_file import (
    Point,
    last_of_each_step,
    read_points,
    read_samples,
    score_metrics,
    stderr_name,
)
from actorsys.outcome import DURATION_SECONDS, LAG_STEPS, METRIC_PREFIX

MAX_COLUMNS = 4
BEST_MODES = ("max", "min")
PROG = "actorsys report"


class _BadArgument(Exception):
    """A bad argument found once the file is read: ``argument`` and what to pass instead."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"argument {argument}: {message}")


def png_path(text: str) -> str:
    """A file name whose directory exists (the plot is written there once the table is out)."""
    directory = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(directory):
        raise argparse.ArgumentTypeError(f"{directory!r} is not a directory; pass a file in an "
                                         "existing one")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; pass a file name")
    return text


def step_number(text: str) -> int:
    try:
        step = int(text)
    except ValueError:
        step = -1
    if step < 0:
        raise argparse.ArgumentTypeError(f"expected a step (an integer >= 0), got {text!r}")
    return step


def add_report_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "report", help="a table and a plot of a metrics file", description=__doc__
    )
    parser.add_argument("metrics", metavar="METRICS.jsonl", type=existing_file,
                        help="a metrics file (one JSON outcome a line)")
    parser.add_argument("--png", metavar="FILE", type=png_path,
                        help="also write a plot of the eval metrics by step")
    parser.add_argument("--compare", metavar=("A", "B"), nargs=2, type=step_number,
                        help="compare step B with step A per dataset: the difference B-A over "
                             "the prompts both scored, its standard error and a p-value "
                             "(paired t-test); needs the points' samples in the file")
    parser.add_argument("--best-metric", metavar="NAME",
                        help="the metric the best point is chosen by (default: the first "
                             "score of the table)")
    parser.add_argument("--best-mode", choices=BEST_MODES, default="max", type=str.lower,
                        help="whether the best point has the largest or the smallest value "
                             "(default max)")
    parser.add_argument("--best-json", metavar="FILE", type=existing_file,
                        help="take the best point from this best.json (the first of its "
                             "{step, value, path} entries) instead")
    add_log_level(parser)
    parser.set_defaults(run=run_report)


def run_report(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    try:
        if args.compare:
            return run_compare(args.metrics, *args.compare)
        points = last_of_each_step(read_points(args.metrics))
        best = best_point(points, args.best_metric, args.best_mode, args.best_json)
    except _BadArgument as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return EXIT_USAGE
    print_table(points, title=args.metrics, best=best)
    if args.png:
        from actorsys.cli.plots import plot_eval

        try:
            plot_eval(points, args.png, best=best)
        except OSError as exc:
            sys.stderr.write(f"{PROG}: argument --png: cannot write {args.png}: "
                             f"{exc.strerror or exc}\n")
            return EXIT_USAGE
        sys.stderr.write(f"wrote {args.png}\n")
    return 0


def best_point(
    points: Sequence[Point], metric: str | None, mode: str, best_json: str | None
) -> tuple[int, str | None] | None:
    """The best point's step, and the metric it is best by (None where ``best_json`` chose
    it): the ok point with the largest (``mode`` max) or smallest ``metric`` (default: the
    first headline score), the earliest on a tie. None if no ok point has it."""
    if best_json is not None:
        return _best_of_file(best_json), None
    ok = [p for p in points if p.ok]
    if metric is None:
        names = score_metrics(ok)
        if not names:
            return None
        metric = names[0]
    elif not metric.startswith(METRIC_PREFIX):
        metric = METRIC_PREFIX + metric
    scored = [p for p in ok if metric in p.metrics and math.isfinite(p.metrics[metric])]
    if not scored:
        raise _BadArgument("--best-metric", f"no ok point has {metric!r}; pass one of the file's "
                                          f"metrics, such as {score_metrics(ok)[:3]}")
    sign = 1.0 if mode == "max" else -1.0
    best = max(sorted(scored, key=lambda p: p.step), key=lambda p: sign * p.metrics[metric])
    return best.step, metric


def _best_of_file(path: str) -> int:
    try:
        with open(path, encoding="utf-8") as f:
            entries = json.load(f)
        step = entries[0]["step"]
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(step)
        return step
    except (OSError, ValueError, RecursionError, LookupError, TypeError) as exc:
        raise _BadArgument("--best-json", f"{path} is not a best.json (a list of {{step, value, "
                                        f"path}}, best first): {exc!r}") from None


def print_table(
    points: list[Point], *, title: str | None = None, best: tuple[int, str | None] | None = None
) -> None:
    """A rich table of ``points`` on stdout: step, status, the headline scores (``value ±
    stderr`` where the standard error is known), lag, time; the ``best`` step starred."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    columns = score_metrics(points)[:MAX_COLUMNS]
    table = Table(title=title)
    table.add_column("step", justify="right")
    table.add_column("status")
    for name in columns:
        table.add_column(name.removeprefix(METRIC_PREFIX), justify="right")
    table.add_column("lag (steps)", justify="right")
    table.add_column("eval (s)", justify="right")
    best_step = None if best is None else best[0]
    for point in sorted(points, key=lambda p: p.step):
        status = "ok" if point.ok else f"[yellow]{escape(f'{point.status}: {point.reason}')}[/]"
        cells = [_score(point, name) for name in columns]
        lag = _number(point.metrics.get(LAG_STEPS), digits=0)
        duration = _number(point.metrics.get(DURATION_SECONDS), digits=2)
        step = f"* {point.step}" if point.ok and point.step == best_step else str(point.step)
        table.add_row(step, status, *cells, lag, duration)
    ok = sum(p.ok for p in points)
    caption = f"{ok} ok, {len(points) - ok} not ok"
    if best is not None:
        by = f" by {escape(best[1])}" if best[1] else " (best.json)"
        caption += f"; * best: step {best[0]}{by}"
    if any(stderr_name(name) in p.metrics for p in points for name in columns):
        caption += "; ± one standard error over prompts"
    table.caption = caption
    Console(soft_wrap=False).print(table)


def run_compare(metrics: str, step_a: int, step_b: int) -> int:
    """Print the paired comparison of ``step_b`` with ``step_a``; :class:`_BadArgument` where a
    step has no ok point with samples, or the two share no dataset's prompt."""
    samples = []
    for step in (step_a, step_b):
        found = read_samples(metrics, step)
        if found is None:
            raise _BadArgument("--compare", f"{metrics} has no ok point of step {step}")
        if not found:
            raise _BadArgument("--compare", f"the point of step {step} keeps no samples "
                                          "(data['samples'], as DatasetEval writes them)")
        samples.append(found)
    found_comparisons = compare(*samples)
    if not found_comparisons:
        raise _BadArgument("--compare", f"steps {step_a} and {step_b} scored no prompt of one "
                                      "dataset in common")
    print_comparison(found_comparisons, step_a, step_b)
    return 0


def print_comparison(comparisons: Sequence[Comparison], step_a: int, step_b: int) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"step {step_b} against step {step_a} (paired t-test over prompts)")
    for name in ("dataset", "prompts", f"step {step_a}", f"step {step_b}", "difference",
                 "stderr", "p-value"):
        table.add_column(name, justify="left" if name == "dataset" else "right")
    for c in comparisons:
        table.add_row(escape(c.dataset), str(c.prompts), _number(c.a), _number(c.b),
                      f"{c.difference:+.3f}", _number(c.stderr),
                      "n/a" if math.isnan(c.p_value) else f"{c.p_value:.3g}")
    table.caption = (f"difference: step {step_b}'s mean minus step {step_a}'s, over the prompts "
                     "both scored (each prompt's samples averaged first)")
    Console(soft_wrap=False).print(table)


def _score(point: Point, name: str) -> str:
    value = point.metrics.get(name)
    stderr = point.metrics.get(stderr_name(name))
    if value is None or stderr is None:
        return _number(value)
    return f"{value:.3f} ± {stderr:.3f}"


def _number(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"

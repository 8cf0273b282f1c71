"""'actorsys report METRICS.jsonl [--png FILE]': a table of the points of a metrics file
('demo' and 'watch' write one; so does 'JsonlSink') and a plot of its eval metrics by
step. The table goes to stdout."""

from __future__ import annotations

import argparse
import os
import sys

from actorsys.cli._conventions import EXIT_USAGE, add_log_level, existing_file, setup_logging
from actorsys.metrics_file import Point, read_points, score_metrics
from actorsys.outcome import DURATION_SECONDS, LAG_STEPS, METRIC_PREFIX

MAX_COLUMNS = 4


def png_path(text: str) -> str:
    """A file name whose directory exists (the plot is written there once the table is out)."""
    directory = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(directory):
        raise argparse.ArgumentTypeError(f"{directory!r} is not a directory; pass a file in an "
                                         "existing one")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; pass a file name")
    return text


def add_report_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "report", help="a table and a plot of a metrics file", description=__doc__
    )
    parser.add_argument("metrics", metavar="METRICS.jsonl", type=existing_file,
                        help="a metrics file (one JSON outcome a line)")
    parser.add_argument("--png", metavar="FILE", type=png_path,
                        help="also write a plot of the eval metrics by step")
    add_log_level(parser)
    parser.set_defaults(run=run_report)


def run_report(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    points = read_points(args.metrics)
    print_table(points, title=args.metrics)
    if args.png:
        from actorsys.cli.plots import plot_eval

        try:
            plot_eval(points, args.png)
        except OSError as exc:
            sys.stderr.write(f"actorsys report: argument --png: cannot write {args.png}: "
                             f"{exc.strerror or exc}\n")
            return EXIT_USAGE
        sys.stderr.write(f"wrote {args.png}\n")
    return 0


def print_table(points: list[Point], *, title: str | None = None) -> None:
    """A rich table of ``points`` on stdout: step, status, the headline scores, lag, time."""
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
    for point in sorted(points, key=lambda p: p.step):
        status = "ok" if point.ok else f"[yellow]{escape(f'{point.status}: {point.reason}')}[/]"
        cells = [_number(point.metrics.get(name)) for name in columns]
        lag = _number(point.metrics.get(LAG_STEPS), digits=0)
        duration = _number(point.metrics.get(DURATION_SECONDS), digits=2)
        table.add_row(str(point.step), status, *cells, lag, duration)
    ok = sum(p.ok for p in points)
    table.caption = f"{ok} ok, {len(points) - ok} not ok"
    Console(soft_wrap=False).print(table)


def _number(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"

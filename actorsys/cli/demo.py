"""'actorsys demo': a tiny model learns 2-digit addition from scratch while every K-th
step's weights are evaluated live on a local fleet of CPU engines, without the trainer
waiting for a score.

Shows the training step and loss and each eval point as it lands (score, lag, or why it was
skipped); leaves DIR/metrics.jsonl and DIR/eval.png (held-out accuracy by step beside the
training loss), and prints a summary with the trainer's stall per eval point next to what a
blocking save would cost. Progress goes to stderr, the summary to stdout.
"""

from __future__ import annotations

import argparse
import os
import sys

from actorsys._flags import int_at_least
from actorsys.cli._conventions import add_log_level, setup_logging

DEFAULT_STEPS = 1200
DEFAULT_EVERY = 100
DEFAULT_ENGINES = 2


def add_demo_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="train a tiny model and evaluate it live (the quickest look at actorsys)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--steps", type=int_at_least(1), default=DEFAULT_STEPS,
                        help=f"training steps (default {DEFAULT_STEPS})")
    parser.add_argument("--every", type=int_at_least(1), default=DEFAULT_EVERY, metavar="K",
                        help=f"submit an eval point every K steps (default {DEFAULT_EVERY})")
    parser.add_argument("--engines", type=int_at_least(1), default=DEFAULT_ENGINES, metavar="N",
                        help=f"CPU engines to evaluate on, one fleet each (default {DEFAULT_ENGINES})")
    parser.add_argument("--engine", choices=("embedded", "vllm"), default="embedded",
                        help="the engine: embedded (transformers, default) or vllm (needs .venv-vllm)")
    parser.add_argument("--out", metavar="DIR", default="demo-out",
                        help="where metrics.jsonl and eval.png go (default ./demo-out)")
    add_log_level(parser)
    parser.set_defaults(run=run_demo_command)


def run_demo_command(args: argparse.Namespace) -> int:
    from rich.console import Console

    from actorsys._errors import ConfigError
    from actorsys.cli.plots import plot_eval
    from actorsys.demo.out_dir import out_problem
    from actorsys.demo.run import (
        SCORE,
        DemoSettings,
        check_engine,
        points_of,
        print_summary,
        run_demo,
        stderr_console,
    )

    settings = DemoSettings(
        steps=args.steps, every=args.every, engines=args.engines, engine=args.engine,
        out=args.out, fleets=args.engines,
    )
    problem = check_engine(settings)
    out_is_unusable = out_problem(os.path.abspath(settings.out))
    if problem is None and out_is_unusable is not None:
        problem = f"argument --out: {out_is_unusable}"
    if problem is not None:
        sys.stderr.write(f"actorsys demo: {problem}\n")
        return 2
    if args.every > args.steps:
        sys.stderr.write(f"actorsys demo: argument --every: {args.every} > --steps {args.steps}; "
                         "pass a K <= --steps\n")
        return 2
    setup_logging(args.log_level)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    try:
        result = run_demo(settings, stderr_console())
    except ConfigError as exc:
        if exc.field != "out":
            raise
        sys.stderr.write(f"actorsys demo: argument --out: {str(exc).removeprefix('out: ')}\n")
        return 2
    plot_eval(
        points_of(result.outcomes),
        os.path.join(settings.out, "eval.png"),
        metrics=[SCORE],
        train_loss=result.losses,
        title="held-out accuracy (numeric) by step",
    )
    print_summary(result, settings, Console(soft_wrap=True))
    return 0 if any(o.ok for o in result.outcomes) else 1

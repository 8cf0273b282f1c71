"""``python -m actorsys`` (also the console script ``actorsys``): demo, watch, report, engine.

Conventions shared by every command: ``--help`` everywhere; a bad argument prints one line
naming it and the fix, exit 2; logs go to stderr and results to stdout; Ctrl-C stops within
the close timeout, exit 130.
"""

from __future__ import annotations

import argparse
import sys
from typing import cast

from actorsys.cli._conventions import EXIT_INTERRUPTED, CommandParser
from actorsys.cli.demo import add_demo_command
from actorsys.cli.report import add_report_command
from actorsys.cli.watch import add_watch_command
from actorsys.fleet.embedded.cli import add_engine_command


def build_parser() -> CommandParser:
    parser = CommandParser(
        prog="actorsys",
        description="Non-blocking evaluation of training checkpoints.",
        epilog="Run 'actorsys COMMAND --help' for a command's options.",
    )
    commands = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", metavar="COMMAND"),
    )
    add_demo_command(commands)
    add_watch_command(commands)
    add_report_command(commands)
    add_engine_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit status (2 for a bad argument, 130 on Ctrl-C)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        sys.stderr.write("actorsys: a COMMAND is required; pick one of those above\n")
        return 2
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        sys.stderr.write("actorsys: interrupted\n")
        return EXIT_INTERRUPTED

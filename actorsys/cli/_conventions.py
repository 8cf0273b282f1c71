"""What every command shares: one-line argument errors, logging to stderr, argument types
whose messages say what is expected (the rules for numbers and seconds are
:mod:`actorsys._flags`')."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import NoReturn

from actorsys._flags import EXIT_USAGE

EXIT_INTERRUPTED = 130
LOG_LEVELS = ("debug", "info", "warning", "error")


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, ``PROG: argument X: what to pass``, and
    exit 2 (argparse's usage block is left to ``--help``)."""

    def error(self, message: str) -> NoReturn:
        if message.startswith(("unrecognized arguments", "the following arguments are required")):
            message += f"; see '{self.prog} --help'"
        sys.stderr.write(f"{self.prog}: {message}\n")
        sys.exit(EXIT_USAGE)


def add_log_level(parser: argparse.ArgumentParser, default: str = "warning") -> None:
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=default,
        type=str.lower,
        help=f"what is logged to stderr (default {default})",
    )


def setup_logging(level: str) -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        force=True,
    )
    if level.lower() != "debug":
        logging.getLogger("httpx").setLevel(logging.WARNING)


def existing_dir(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory; pass an existing one")
    return text


def existing_file(text: str) -> str:
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a file; pass an existing one")
    return text

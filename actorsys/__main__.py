"""``python -m actorsys``: the command line."""

from __future__ import annotations

import argparse
import sys

from actorsys.fleet.embedded.cli import add_engine_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="actorsys", description=__doc__)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_engine_command(commands)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())

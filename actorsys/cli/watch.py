"""placeholder"""
from __future__ import annotations

import argparse


def add_watch_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pass

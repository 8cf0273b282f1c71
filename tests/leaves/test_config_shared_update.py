"""--eval-shared-update and --eval-shared-update-timeout: the flags of EvalConfig's
shared_update and shared_update_timeout."""

from __future__ import annotations

import argparse

import pytest

from actorsys import EvalConfig


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    EvalConfig.add_arguments(parser)
    return parser.parse_args(argv)


def test_the_shared_update_flags_set_the_policy_and_its_budget() -> None:
    config = EvalConfig.from_args(parse(["--eval-shared-update", "preempt",
                                         "--eval-shared-update-timeout", "5"]))
    assert (config.shared_update, config.shared_update_timeout) == ("preempt", 5.0)
    default = EvalConfig.from_args(parse([]))
    assert (default.shared_update, default.shared_update_timeout) == ("wait", 60.0)


def test_an_unknown_policy_is_refused_under_its_flag() -> None:
    with pytest.raises(argparse.ArgumentError, match="--eval-shared-update"):
        parse(["--eval-shared-update", "later"])

"""The eval fleet's flags (miles' --eval-num-gpus, --eval-num-gpus-per-engine, and
--eval-engine), added by EvalConfig.add_arguments and read back as engines and resources."""

from __future__ import annotations

import argparse

import pytest

from actorsys import ConfigError, EvalConfig
from actorsys.fleet.flags import FleetFlags, fleet_flags_from_args


def parse(argv: list[str], parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    parser = parser or argparse.ArgumentParser(exit_on_error=False)
    EvalConfig.add_arguments(parser)
    return parser.parse_args(argv)


def test_gpus_split_into_engines_of_g_gpus_each() -> None:
    flags = fleet_flags_from_args(parse(
        ["--eval-num-gpus", "8", "--eval-num-gpus-per-engine", "2", "--eval-engine", "vllm"]))
    assert (flags.num_engines, flags.resources, flags.engine) == (4, {"num_gpus": 2}, "vllm")


def test_no_gpus_is_one_cpu_engine_and_so_is_leaving_the_flags_unset() -> None:
    for argv in (["--eval-num-gpus", "0"], []):
        flags = fleet_flags_from_args(parse(argv))
        assert (flags.num_engines, flags.resources, flags.engine) == (1, {"num_cpus": 1}, "embedded")


def test_gpus_that_do_not_split_name_the_flag() -> None:
    with pytest.raises(ConfigError, match="--eval-num-gpus: 3 GPUs do not split"):
        fleet_flags_from_args(parse(["--eval-num-gpus", "3", "--eval-num-gpus-per-engine", "2"]))


@pytest.mark.parametrize("argv", [["--eval-num-gpus", "-1"], ["--eval-num-gpus-per-engine", "0"],
                                  ["--eval-engine", "sglang"], ["--eval-num-gpus", "two"]])
def test_a_bad_value_is_an_argparse_error(argv: list[str]) -> None:
    with pytest.raises(argparse.ArgumentError):
        parse(argv)


def test_flags_the_trainer_defines_are_left_to_it_and_read_back() -> None:
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--eval-num-gpus", type=int, default=4)
    assert fleet_flags_from_args(parse([], parser)).num_engines == 4


def test_fleet_flags_check_their_fields() -> None:
    with pytest.raises(ConfigError, match="--eval-engine"):
        FleetFlags(engine="tgi")

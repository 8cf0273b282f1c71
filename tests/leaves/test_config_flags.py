"""EvalConfig.add_arguments / from_args: trainer flags map one to one onto the config."""

from __future__ import annotations

import argparse

import pytest

from actorsys import ConfigError, EvalConfig

ALL_FLAGS = [
    "--eval-hf-dir", "/dev/shm/eval",
    "--eval-max-in-flight", "3",
    "--eval-overflow-policy", "skip",
    "--eval-keep-snapshots", "1",
    "--eval-timeout", "900",
    "--eval-pin-timeout", "120.5",
    "--eval-close-timeout", "10",
    "--eval-probe", "off",
]


def parse(argv: list[str], parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    parser = parser or argparse.ArgumentParser(exit_on_error=False)
    EvalConfig.add_arguments(parser)
    return parser.parse_args(argv)


def test_every_flag_lands_in_its_field() -> None:
    config = EvalConfig.from_args(parse(ALL_FLAGS))
    assert config == EvalConfig(
        hf_dir="/dev/shm/eval", max_in_flight=3, overflow="skip", keep_snapshots=1,
        eval_timeout=900.0, pin_timeout=120.5, close_timeout=10.0, probe=False,
    )


def test_no_flags_give_the_default_config() -> None:
    assert EvalConfig.from_args(parse([])) == EvalConfig()


def test_a_miles_save_hf_pattern_reuses_the_trainers_checkpoints() -> None:
    config = EvalConfig.from_args(parse(["--save-hf", "/ckpt/hf/rollout_{rollout_id}"]))
    assert config.reuse_path(40) == "/ckpt/hf/rollout_40"


def test_a_flag_the_trainer_already_defines_is_left_to_it() -> None:
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--save-hf", type=str, default=None, help="the trainer's own")
    args = parse(["--save-hf", "/ckpt/{rollout_id}", "--eval-overflow-policy", "latest"], parser)
    config = EvalConfig.from_args(args)
    assert config.save_hf == "/ckpt/{step}"
    assert config.overflow == "latest"


def test_overrides_set_fields_that_have_no_flag() -> None:
    config = EvalConfig.from_args(parse(["--eval-hf-dir", "/x"]), base_checkpoint="/base")
    assert config.base_checkpoint == "/base"
    assert config.hf_dir == "/x"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--eval-max-in-flight", "0"], "max_in_flight: expected an integer >= 1"),
        (["--eval-max-in-flight", "two"], "'two' is not an integer"),
        (["--eval-overflow-policy", "drop"], "overflow: expected one of backpressure, skip"),
        (["--eval-timeout", "-1"], "eval_timeout: expected a number of seconds > 0"),
        (["--save-hf", "/ckpt/latest"], "save_hf: expected a path pattern"),
        (["--eval-probe", "maybe"], "'maybe' is not on or off"),
    ],
)
def test_a_bad_value_is_an_argparse_error_naming_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(argparse.ArgumentError) as caught:
        parse(argv)
    assert caught.value.argument_name is not None
    assert argv[0] in caught.value.argument_name
    assert message in str(caught.value)


def test_a_bad_value_in_a_built_namespace_notes_its_flag() -> None:
    namespace = argparse.Namespace(eval_keep_snapshots=-1)
    with pytest.raises(ConfigError) as caught:
        EvalConfig.from_args(namespace)
    assert caught.value.field == "keep_snapshots"
    assert caught.value.__notes__ == ["set by --eval-keep-snapshots"]


def test_help_shows_the_config_defaults() -> None:
    parser = argparse.ArgumentParser()
    EvalConfig.add_arguments(parser)
    text = parser.format_help()
    assert "(default: backpressure)" in text
    assert "(default: 600.0)" in text

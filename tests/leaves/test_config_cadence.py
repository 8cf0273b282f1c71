"""miles' cadence and the best-keeping flags: --eval-interval, --skip-eval-before-train,
--eval-best-metric, --eval-best-mode, --eval-keep-best, and EvalConfig.due."""

from __future__ import annotations

import argparse

import pytest

from actorsys import ConfigError, EvalConfig


def parse(argv: list[str], parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    parser = parser or argparse.ArgumentParser(exit_on_error=False)
    EvalConfig.add_arguments(parser)
    return parser.parse_args(argv)


def test_the_deciding_flags_land_in_their_fields() -> None:
    config = EvalConfig.from_args(parse([
        "--eval-interval", "10", "--skip-eval-before-train", "--eval-best-metric", "eval/gsm8k",
        "--eval-best-mode", "min", "--eval-keep-best", "2",
    ]))
    assert (config.eval_interval, config.skip_eval_before_train) == (10, True)
    assert (config.best_metric, config.best_mode, config.keep_best) == ("eval/gsm8k", "min", 2)


def test_unset_deciding_flags_keep_the_defaults() -> None:
    config = EvalConfig.from_args(parse([]))
    assert config.eval_interval is None and config.skip_eval_before_train is False
    assert (config.best_metric, config.best_mode, config.keep_best) == (None, "max", 0)


def test_miles_own_cadence_flags_are_read_back_from_the_trainers_parser() -> None:
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--eval-interval", type=int, default=None)
    parser.add_argument("--skip-eval-before-train", action="store_true", default=False)
    config = EvalConfig.from_args(parse(["--eval-interval", "5", "--skip-eval-before-train"], parser))
    assert (config.eval_interval, config.skip_eval_before_train) == (5, True)
    assert not config.due(0) and config.due(5) and not config.due(6)


def test_keep_best_without_a_metric_is_an_error_naming_best_metric() -> None:
    namespace = parse(["--eval-keep-best", "1"])
    with pytest.raises(ConfigError, match="^best_metric: keep_best needs best_metric") as caught:
        EvalConfig.from_args(namespace)
    assert not getattr(caught.value, "__notes__", None)  # --eval-best-metric was not given


@pytest.mark.parametrize("argv", [["--eval-interval", "0"], ["--eval-best-mode", "up"],
                                  ["--eval-keep-best", "-1"]])
def test_a_bad_deciding_flag_is_an_argparse_error(argv: list[str]) -> None:
    with pytest.raises(argparse.ArgumentError):
        parse(argv)


@pytest.mark.parametrize(
    ("interval", "skip", "due"),
    [
        (None, False, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]),
        (None, True, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]),
        (5, False, [0, 5, 10]),
        (5, True, [5, 10]),
        (1, True, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]),
    ],
)
def test_due_is_a_multiple_of_the_interval_and_step_zero_unless_skipped(
    interval: int | None, skip: bool, due: list[int]
) -> None:
    config = EvalConfig(eval_interval=interval, skip_eval_before_train=skip)
    assert [step for step in range(11) if config.due(step)] == due


@pytest.mark.parametrize(("field", "value"), [("eval_interval", 0), ("eval_interval", 2.5),
                                              ("skip_eval_before_train", "yes")])
def test_bad_cadence_fields_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"^{field}:"):
        EvalConfig(**{field: value})  # type: ignore[arg-type]

"""--eval-resume: the flag of EvalConfig.resume."""

from __future__ import annotations

import argparse

import pytest

from actorsys import ConfigError, EvalConfig


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    EvalConfig.add_arguments(parser)
    return parser.parse_args(argv)


def test_eval_resume_turns_resume_on_and_is_off_by_default() -> None:
    assert EvalConfig.from_args(parse(["--eval-hf-dir", "/x", "--eval-resume"])).resume is True
    assert EvalConfig.from_args(parse(["--save-hf", "/ckpt/{step}", "--eval-resume"])).resume is True
    assert EvalConfig.from_args(parse([])).resume is False


def test_eval_resume_without_a_place_for_the_journal_notes_its_flag() -> None:
    with pytest.raises(ConfigError, match="^resume: needs hf_dir") as caught:
        EvalConfig.from_args(parse(["--eval-resume"]))
    assert caught.value.__notes__ == ["set by --eval-resume"]


def test_the_help_says_what_eval_resume_does() -> None:
    parser = argparse.ArgumentParser()
    EvalConfig.add_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert "--eval-resume after a crash, evaluate again the points" in text

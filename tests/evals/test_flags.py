"""miles' eval flags on EvalConfig.add_arguments, read back by datasets_from_args."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from actorsys import ConfigError, EvalConfig
from actorsys.evals import DatasetError, datasets_from_args


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="train", exit_on_error=False)
    EvalConfig.add_arguments(parser)
    return parser


def data(tmp_path: Path, name: str, records: list[dict]) -> str:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_prompt_data_pairs_with_the_setting_flags(tmp_path: Path) -> None:
    a = data(tmp_path, "a", [{"q": "1+1", "a": "2"}])
    b = data(tmp_path, "b", [{"q": "2+2", "a": "4"}])
    args = parser().parse_args([
        "--eval-prompt-data", "first", a, "second", b,
        "--n-samples-per-eval-prompt", "4", "--eval-max-response-len", "32",
        "--eval-temperature", "0.8", "--eval-top-p", "0.9",
        "--eval-input-key", "q", "--eval-label-key", "a", "--rm-type", "dapo",
    ])
    first, second = datasets_from_args(args)
    assert (first.name, second.name, second.prompts) == ("first", "second", ["2+2"])
    assert (first.n_samples, first.max_tokens, first.temperature, first.top_p) == (4, 32, 0.8, 0.9)
    assert first.scorer == "dapo"


def test_eval_config_settings_win_over_flags_and_both_sources_add_up(tmp_path: Path) -> None:
    data(tmp_path, "a", [{"prompt": "p", "label": "1"}])
    b = data(tmp_path, "b", [{"prompt": "p", "label": "1"}])
    config = tmp_path / "eval.yaml"
    config.write_text("datasets:\n  - {name: a, path: a.jsonl, n_samples: 2}\n")
    args = parser().parse_args([
        "--eval-config", str(config), "--eval-prompt-data", "b", b,
        "--n-samples-per-eval-prompt", "8", "--eval-temperature", "0.5",
    ])
    a_set, b_set = datasets_from_args(args)
    assert (a_set.n_samples, a_set.temperature) == (2, 0.5)
    assert (b_set.n_samples, b_set.temperature) == (8, 0.5)


def test_unset_eval_flags_fall_back_to_the_trainers_own_miles_flags(tmp_path: Path) -> None:
    path = data(tmp_path, "a", [{"input": "p", "label": "1"}])
    trainer = argparse.ArgumentParser()
    trainer.add_argument("--input-key", default="input")
    trainer.add_argument("--rollout-temperature", type=float, default=1.0)
    trainer.add_argument("--rm-type", default="math")
    EvalConfig.add_arguments(trainer)
    (dataset,) = datasets_from_args(trainer.parse_args(["--eval-prompt-data", "a", path]))
    assert (dataset.input_key, dataset.temperature, dataset.scorer) == ("input", 1.0, "math")


def test_no_eval_data_flags_give_no_datasets() -> None:
    assert datasets_from_args(parser().parse_args([])) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--eval-prompt-data", "a"], "expected NAME PATH pairs, got 1 values"),
        (["--n-samples-per-eval-prompt", "0"], "n_samples: expected an integer >= 1"),
        (["--eval-top-p", "2"], r"top_p: expected a number in \(0.0, 1.0\]"),
        (["--eval-temperature", "warm"], "'warm' is not a number"),
        (["--rm-type", "fuzzy"], "unknown scorer 'fuzzy'"),
    ],
)
def test_bad_flags_are_argparse_errors_naming_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(argparse.ArgumentError, match=message) as caught:
        parser().parse_args(argv)
    assert caught.value.argument_name is not None
    assert caught.value.argument_name.startswith(argv[0])


def test_a_bad_data_file_and_duplicate_names_are_config_errors(tmp_path: Path) -> None:
    good = data(tmp_path, "a", [{"prompt": "p", "label": "1"}])
    bad = data(tmp_path, "bad", [{"prompt": "p"}])
    with pytest.raises(DatasetError, match=r"bad\.jsonl, line 1: label: missing"):
        datasets_from_args(parser().parse_args(["--eval-prompt-data", "a", good, "b", bad]))
    with pytest.raises(ConfigError, match=r"\['a'\] appear twice"):
        datasets_from_args(parser().parse_args(["--eval-prompt-data", "a", good, "a", good]))

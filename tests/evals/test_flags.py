"""miles' eval flags on EvalConfig.add_arguments, read back by datasets_from_args."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pytest

from actorsys import ConfigError, EvalConfig
from actorsys.evals import DatasetError, EvalDataset, datasets_from_args


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
        (["--apply-chat-template-kwargs", "{enable_thinking: false}"],
         r"^argument --apply-chat-template-kwargs: not JSON \(.*\); expected an object"),
        (["--apply-chat-template-kwargs", "[1]"], "expected a JSON object of keyword arguments"),
        (["--custom-rm-path", "tests.nowhere.fn"], "'tests.nowhere.fn' does not import"),
        (["--eval-top-k", "-2"], "top_k: expected an integer >= -1"),
        (["--rm-url", "localhost:8000"], "rm_url: expected an http"),
    ],
)
def test_bad_flags_are_argparse_errors_naming_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(argparse.ArgumentError, match=message) as caught:
        parser().parse_args(argv)
    assert caught.value.argument_name is not None
    assert caught.value.argument_name.startswith(argv[0])
    assert "\n" not in str(caught.value)


def test_a_bad_data_file_and_duplicate_names_are_config_errors(tmp_path: Path) -> None:
    good = data(tmp_path, "a", [{"prompt": "p", "label": "1"}])
    bad = data(tmp_path, "bad", [{"prompt": "p"}])
    with pytest.raises(DatasetError, match=r"bad\.jsonl, line 1: label: missing"):
        datasets_from_args(parser().parse_args(["--eval-prompt-data", "a", good, "b", bad]))
    with pytest.raises(ConfigError, match=r"\['a'\] appear twice"):
        datasets_from_args(parser().parse_args(["--eval-prompt-data", "a", good, "a", good]))


CHAT_RECORDS = [{"messages": [{"role": "user", "content": "2+2?"}], "label": "4",
                 "tools": [{"type": "function", "function": {"name": "add"}}],
                 "metadata": {"rm_type": "dapo"}}]


def test_the_chat_and_reward_flags_alone(tmp_path: Path) -> None:
    path = data(tmp_path, "chat", CHAT_RECORDS)
    args = parser().parse_args([
        "--eval-prompt-data", "aime", path, "--eval-input-key", "messages",
        "--apply-chat-template", "--apply-chat-template-kwargs", '{"enable_thinking": false}',
        "--eval-tool-key", "tools", "--metadata-key", "metadata", "--eval-top-k", "20",
        "--rm-type", "remote_rm", "--rm-url", "http://127.0.0.1:9/rm",
    ])
    (dataset,) = datasets_from_args(args)
    assert dataset.apply_chat_template is True
    assert dataset.chat_template_kwargs == {"enable_thinking": False}
    assert (dataset.tool_key, dataset.metadata_key, dataset.top_k) == ("tools", "metadata", 20)
    assert (dataset.scorer, dataset.rm_url) == ("remote_rm", "http://127.0.0.1:9/rm")
    assert dataset.scorer_of(0) == "dapo"
    assert dataset.sampling_kwargs()["extra"]["top_k"] == 20
    custom = parser().parse_args(["--eval-prompt-data", "a", path, "--eval-input-key", "messages",
                                  "--apply-chat-template", "--rm-type", "math",
                                  "--custom-rm-path", "tests.evals.test_miles_rewards.half_length"])
    (dataset,) = datasets_from_args(custom)
    assert dataset.scorer == "tests.evals.test_miles_rewards.half_length"


def test_messages_without_apply_chat_template_name_the_flag(tmp_path: Path) -> None:
    path = data(tmp_path, "chat", CHAT_RECORDS)
    args = parser().parse_args(["--eval-prompt-data", "a", path, "--eval-input-key", "messages"])
    with pytest.raises(DatasetError, match=r"line 1: messages: .*--apply-chat-template"):
        datasets_from_args(args)


def miles_parser() -> argparse.ArgumentParser:
    """A trainer's parser that already defines miles' rollout, data and reward flags, with
    miles' own types and defaults."""
    trainer = argparse.ArgumentParser(prog="train", exit_on_error=False)
    trainer.add_argument("--input-key", type=str, default="input")
    trainer.add_argument("--label-key", type=str, default=None)
    trainer.add_argument("--tool-key", type=str, default="tools")
    trainer.add_argument("--metadata-key", type=str, default="metadata")
    trainer.add_argument("--apply-chat-template", action="store_true", default=False)
    trainer.add_argument("--apply-chat-template-kwargs", type=json.loads, default="{}")
    trainer.add_argument("--rollout-top-k", type=int, default=-1)
    trainer.add_argument("--eval-tool-key", type=str, default=None)
    trainer.add_argument("--eval-top-k", type=int, default=None)
    trainer.add_argument("--rm-type", type=str, default=None)
    trainer.add_argument("--rm-url", type=str, default=None)
    trainer.add_argument("--custom-rm-path", type=str, default=None)
    EvalConfig.add_arguments(trainer)
    return trainer


def test_on_a_parser_with_miles_flags_the_eval_falls_back_to_them(tmp_path: Path) -> None:
    chat = data(tmp_path, "chat", [{"input": "2+2?", "label": "4", "tools": []}])
    args = miles_parser().parse_args([
        "--eval-prompt-data", "chat", chat, "--apply-chat-template",
        "--apply-chat-template-kwargs", '{"enable_thinking": false}', "--rollout-top-k", "5",
        "--rm-type", "deepscaler",
    ])
    (dataset,) = datasets_from_args(args)
    assert (dataset.input_key, dataset.tool_key, dataset.metadata_key) == ("input", "tools", "metadata")
    assert dataset.apply_chat_template is True
    assert dataset.chat_template_kwargs == {"enable_thinking": False}
    assert (dataset.top_k, dataset.scorer) == (5, "deepscaler")
    eval_own = miles_parser().parse_args(["--eval-prompt-data", "chat", chat, "--eval-top-k", "3"])
    (plain,) = datasets_from_args(eval_own)
    assert (plain.apply_chat_template, plain.chat_template_kwargs, plain.top_k) == (False, None, 3)
    assert plain.tools(0) is None  # miles' default --tool-key applies to chat prompts only
    assert "top_k" not in datasets_from_args(miles_parser().parse_args(
        ["--eval-prompt-data", "chat", chat]))[0].sampling_kwargs()["extra"]  # -1: off


def test_the_same_keys_in_an_eval_config(tmp_path: Path) -> None:
    data(tmp_path, "chat", CHAT_RECORDS)
    config = tmp_path / "eval.yaml"
    config.write_text(
        "defaults:\n"
        "  apply_chat_template: true\n"
        "  apply_chat_template_kwargs: {enable_thinking: false}\n"
        "datasets:\n"
        "  - name: aime\n"
        "    path: chat.jsonl\n"
        "    input_key: messages\n"
        "    tool_key: tools\n"
        "    metadata_key: metadata\n"
        "    top_k: 8\n"
        "    rm_type: remote_rm\n"
        "    rm_url: http://127.0.0.1:9/rm\n"
        "  - name: custom\n"
        "    path: chat.jsonl\n"
        "    input_key: messages\n"
        "    custom_rm_path: tests.evals.test_miles_rewards.half_length\n"
    )
    aime, custom = datasets_from_args(parser().parse_args(["--eval-config", str(config)]))
    assert aime.chat_template_kwargs == {"enable_thinking": False} and aime.apply_chat_template
    assert (aime.tool_key, aime.metadata_key, aime.top_k, aime.scorer) == (
        "tools", "metadata", 8, "remote_rm")
    assert custom.scorer == "tests.evals.test_miles_rewards.half_length"
    assert aime.fingerprint() != custom.fingerprint()
    plain = EvalDataset(name="p", records=({"prompt": "p", "label": "1"},))
    before = ("input_key", "label_key", "n_samples", "max_tokens", "temperature", "top_p", "stop",
              "limit", "score_timeout")
    settings = {"name": "p", **{key: getattr(plain, key) for key in before}, "scorer": "exact",
                "records": [{"prompt": "p", "label": "1"}]}
    payload = json.dumps(settings, sort_keys=True, default=repr).encode()
    assert plain.fingerprint() == hashlib.sha256(payload).hexdigest()  # watch's ledger keys hold

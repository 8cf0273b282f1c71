"""miles' eval flags, on :meth:`EvalConfig.add_arguments <actorsys.EvalConfig.add_arguments>`
(registered there through :mod:`actorsys.flag_groups` when this module is imported), and
:func:`datasets_from_args`, which turns them into datasets.

``--eval-prompt-data NAME PATH [NAME PATH ...]`` and ``--eval-config FILE`` say what to
evaluate; ``--n-samples-per-eval-prompt``, ``--eval-max-response-len``, ``--eval-temperature``,
``--eval-top-p``, ``--eval-top-k``, ``--eval-input-key``, ``--eval-label-key``,
``--rm-type``, ``--rm-url`` and ``--custom-rm-path`` how; ``--apply-chat-template``,
``--apply-chat-template-kwargs JSON``, ``--eval-tool-key`` and ``--metadata-key`` make them
chat evaluations. As in miles, an unset ``--eval-input-key`` / ``--eval-label-key`` /
``--eval-tool-key`` / ``--eval-max-response-len`` / ``--eval-temperature`` / ``--eval-top-p`` /
``--eval-top-k`` falls back to the trainer's ``--input-key`` / ``--label-key`` /
``--tool-key`` / ``--rollout-max-response-len`` / ``--rollout-temperature`` /
``--rollout-top-p`` / ``--rollout-top-k`` where the trainer's parser has them, and
``--apply-chat-template`` and its kwargs are miles' own rollout flags. A flag the parser
already defines (miles defines all of these) is left to it and read back from the namespace.
``--custom-rm-path`` wins over ``--rm-type``, as in miles.

The trainer, the external-server eval and the watch service all read the datasets through
:func:`datasets_from_args`, so eval settings are defined once.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import Any

from actorsys._errors import ConfigError
from actorsys._flags import Flag, add_flag, add_flags
from actorsys.evals.data.dataset import DatasetError, EvalDataset
from actorsys.evals.data.eval_config import load_eval_config
from actorsys.evals.scoring.scorers import SCORERS, check_scorer
from actorsys.flag_groups import register_flags

SETTING_FLAGS = (
    Flag("--n-samples-per-eval-prompt", "n_samples", int, "N",
         "samples per eval prompt, for pass@k (default 1)"),
    Flag("--eval-max-response-len", "max_tokens", int, "TOKENS",
         "most tokens per eval answer (default 256)",
         miles_fallback="rollout_max_response_len"),
    Flag("--eval-temperature", "temperature", float, "T",
         "sampling temperature of eval answers (default 0: greedy)",
         miles_fallback="rollout_temperature"),
    Flag("--eval-top-p", "top_p", float, "P", "nucleus sampling of eval answers (default 1)",
         miles_fallback="rollout_top_p"),
    Flag("--eval-input-key", "input_key", str, "KEY",
         "record key of the prompt in eval data (default prompt)", miles_fallback="input_key"),
    Flag("--eval-label-key", "label_key", str, "KEY",
         "record key of the label in eval data (default label)", miles_fallback="label_key"),
    Flag("--rm-type", "scorer", str, "SCORER",
         f"how eval answers are graded: {', '.join(SCORERS)}, boxed_<scorer> "
         "(default exact)"),
    Flag("--eval-top-k", "top_k", int, "K",
         "top-k sampling of eval answers (-1 or 0: off)", miles_fallback="rollout_top_k"),
    Flag("--eval-tool-key", "tool_key", str, "KEY",
         "record key of the tool schemas handed to the chat template", miles_fallback="tool_key"),
    Flag("--metadata-key", "metadata_key", str, "KEY",
         "record key of the metadata (its rm_type overrides --rm-type for that record)"),
    Flag("--apply-chat-template-kwargs", "chat_template_kwargs", str, "JSON",
         'keyword arguments of the chat template, e.g. \'{"enable_thinking": false}\''),
    Flag("--rm-url", "rm_url", str, "URL", "the reward server of --rm-type remote_rm"),
)
CHAT_TEMPLATE_FLAG = Flag(
    "--apply-chat-template", "apply_chat_template", str, "",
    "render eval prompts (strings or chat messages) with the snapshot's own chat template",
)
CUSTOM_RM_FLAG = Flag(
    "--custom-rm-path", "scorer", str, "PKG.MODULE.FN",
    "a scorer (answer, label, record) -> float named by its dotted path (wins over --rm-type)",
)

SAMPLE_RECORD = {"prompt": "p", "label": "1"}


class _Pairs(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        items = [values] if isinstance(values, str) else list(values or [])
        if len(items) % 2:
            raise argparse.ArgumentError(
                self, f"expected NAME PATH pairs, got {len(items)} values: {' '.join(items)}"
            )
        setattr(namespace, self.dest, items)


@register_flags
def add_dataset_arguments(group: argparse._ArgumentGroup) -> None:
    """Add the eval-data flags to ``group`` (skipping flags its parser already defines)."""
    add_flag(group, "--eval-prompt-data", dest="eval_prompt_data", nargs="+", action=_Pairs,
             metavar="NAME PATH", default=None,
             help="eval datasets as NAME PATH pairs of JSONL files")
    add_flag(group, "--eval-config", dest="eval_config", metavar="FILE", default=None,
             help="YAML file of eval datasets: {defaults: {...}, datasets: [{name, path, ...}]}")
    add_flags(group, (*SETTING_FLAGS, CUSTOM_RM_FLAG), _check_setting, message=_message)
    add_flag(group, CHAT_TEMPLATE_FLAG.option, dest=CHAT_TEMPLATE_FLAG.dest, action="store_true",
             default=None, help=CHAT_TEMPLATE_FLAG.help)


def dataset_settings(namespace: argparse.Namespace) -> dict[str, Any]:
    """The dataset settings the flags in ``namespace`` set (unset ones are left out)."""
    settings: dict[str, Any] = {}
    for flag in SETTING_FLAGS:
        value = getattr(namespace, flag.dest, None)
        if value is None and flag.miles_fallback is not None:
            value = getattr(namespace, flag.miles_fallback, None)
        if value is not None:
            settings[flag.field] = value
    if "chat_template_kwargs" in settings:
        kwargs = template_kwargs(settings["chat_template_kwargs"])
        if kwargs:
            settings["chat_template_kwargs"] = kwargs
        else:
            del settings["chat_template_kwargs"]  # miles' default: {}
    if getattr(namespace, CHAT_TEMPLATE_FLAG.dest, None):
        settings["apply_chat_template"] = True
    custom = getattr(namespace, CUSTOM_RM_FLAG.dest, None)
    if custom:
        settings["scorer"] = custom
    return settings


def template_kwargs(value: object) -> dict[str, Any]:
    """``--apply-chat-template-kwargs`` as a dict: its JSON text (or the dict a trainer's own
    parser made of it). Raises :class:`ConfigError` naming the flag for anything else."""
    option = "--apply-chat-template-kwargs"
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError as exc:
            raise ConfigError(option, f"not JSON ({exc}); expected an object such as "
                                      '\'{"enable_thinking": false}\'') from None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigError(option, f"expected a JSON object of keyword arguments, got {value!r}")
    return dict(value)


def datasets_from_args(namespace: argparse.Namespace) -> list[EvalDataset]:
    """The datasets of ``--eval-config`` then of ``--eval-prompt-data``, with the setting
    flags as their defaults (a setting in the eval config file wins over its flag). An empty
    list when neither is set. Raises :class:`~actorsys.evals.DatasetError` (a
    :class:`~actorsys.ConfigError`) for a bad file, ``ConfigError`` for two datasets of one
    name. Blocking (reads the files)."""
    settings = dataset_settings(namespace)
    datasets: list[EvalDataset] = []
    config = getattr(namespace, "eval_config", None)
    if config:
        datasets.extend(load_eval_config(config, defaults=settings))
    pairs = list(getattr(namespace, "eval_prompt_data", None) or [])
    if len(pairs) % 2:
        raise ConfigError("--eval-prompt-data", f"expected NAME PATH pairs, got {pairs}")
    for name, path in zip(pairs[::2], pairs[1::2], strict=True):
        try:
            datasets.append(EvalDataset.from_jsonl(path, name=name, **settings))
        except DatasetError as exc:
            exc.add_note(f"set by --eval-prompt-data {name} {path}")
            raise
    names = [dataset.name for dataset in datasets]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(
            "--eval-prompt-data", f"dataset names must be unique; {duplicates} appear twice"
        )
    return datasets


def _check_setting(flag: Flag, value: Any) -> Any:
    """A dataset setting's flag value as the dataset takes it (:class:`ConfigError` if not)."""
    if flag.field == "scorer":
        return check_scorer(value)
    if flag.field == "chat_template_kwargs":
        return template_kwargs(value)
    if flag.field in ("input_key", "label_key", "tool_key", "metadata_key"):
        if not value:
            raise argparse.ArgumentTypeError("expected a key name")
        return value
    EvalDataset(name="flag", records=(SAMPLE_RECORD,), **{flag.field: value})
    return value


def _message(error: ConfigError) -> str:
    """The dataset's message without its field (argparse names the flag), on one line."""
    return " ".join(str(error).split(": ", 1)[-1].split())

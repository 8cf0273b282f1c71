"""``load_eval_config``: the datasets of a YAML eval config, in the shape of miles'
``--eval-config``::

    defaults:
      n_samples: 4            # miles: n_samples_per_eval_prompt
      temperature: 0.7
    datasets:
      - name: math
        path: data/math.jsonl # relative paths resolve against this file
        scorer: math          # miles: rm_type (or custom_rm_path: pkg.module.fn)
        max_tokens: 512       # miles: max_response_len
      - name: aime
        path: data/aime.jsonl # prompts: chat messages under "messages"
        input_key: messages
        apply_chat_template: true
        chat_template_kwargs: {enable_thinking: false}   # miles: apply_chat_template_kwargs
        tool_key: tools
        metadata_key: metadata
        scorer: deepscaler
      - name: mmlu
        path: data/mmlu.jsonl
        scorer: choice
        n_samples: 1

The mapping may also sit under a top-level ``eval:`` key. A setting of a dataset overrides
``defaults``, which override the ``defaults`` argument (the command line's flags). An unknown
key, a missing ``name`` or ``path``, a bad value or a bad data file raises
:class:`~actorsys.evals.DatasetError` naming the file, the line and the key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import yaml

from actorsys._errors import ConfigError
from actorsys.evals.data.dataset import SAMPLING_FIELDS, DatasetError, EvalDataset

MAX_NODES = 100_000
"""The most values an eval config may hold once its YAML aliases are expanded."""
MILES_KEYS = {
    "n_samples_per_eval_prompt": "n_samples",
    "max_response_len": "max_tokens",
    "rm_type": "scorer",
    "custom_rm_path": "scorer",
    "apply_chat_template_kwargs": "chat_template_kwargs",
}


def load_eval_config(
    path: str | os.PathLike[str], *, defaults: Mapping[str, Any] | None = None
) -> list[EvalDataset]:
    """The datasets ``path`` describes, each read and checked. ``defaults`` (settings such as
    ``n_samples``) apply where the file sets nothing. Blocking (reads the files)."""
    file = os.fspath(path)
    check_settings("load_eval_config(defaults)", defaults or {})
    try:
        with open(file, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise DatasetError(file, None, None, "no such eval config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(file, None, None, f"cannot be read: {exc}") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        _check_expansion(file, root)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = None if mark is None else mark.line + 1
        raise DatasetError(file, line, None, f"invalid YAML: {exc}") from None
    except RecursionError:
        raise DatasetError(file, None, None, "YAML nested too deeply") from None
    if isinstance(data, dict) and set(data) == {"eval"}:
        data = data["eval"]
        root = _value_node(root, "eval")
    if not isinstance(data, dict):
        raise DatasetError(file, _line(root), None, "expected a mapping with 'datasets' (and "
                                                    "optionally 'defaults')")
    unknown = sorted(set(data) - {"defaults", "datasets"})
    if unknown:
        raise DatasetError(file, _key_line(root, unknown[0]), unknown[0],
                           "unknown top-level key; expected 'defaults' and 'datasets'")
    shared = _settings(file, data.get("defaults") or {}, _value_node(root, "defaults"), "defaults")
    entries = data.get("datasets")
    if not isinstance(entries, list) or not entries:
        raise DatasetError(file, _key_line(root, "datasets"), "datasets",
                           "expected a non-empty list of datasets, each with name and path")
    items = _value_node(root, "datasets")
    base = os.path.dirname(os.path.abspath(file))
    datasets: list[EvalDataset] = []
    for index, entry in enumerate(entries):
        node = items.value[index] if isinstance(items, yaml.SequenceNode) else None
        datasets.append(_dataset(file, base, entry, node, {**(defaults or {}), **shared}))
    names = [dataset.name for dataset in datasets]
    for index, name in enumerate(names):
        if name in names[:index]:
            node = items.value[index] if isinstance(items, yaml.SequenceNode) else None
            raise DatasetError(file, _line(node), "name", f"dataset name {name!r} appears twice")
    return datasets


def _check_expansion(file: str, root: yaml.Node | None) -> None:
    """Raise :class:`DatasetError` when ``root`` is larger than :data:`MAX_NODES` nodes once
    its aliases are expanded (a "billion laughs" of nested aliases: a few hundred bytes that
    expand to gigabytes wherever the value is printed or walked), or refers to itself."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise DatasetError(file, _line(node), None, "a YAML alias that refers to itself")
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children: list[yaml.Node] = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > MAX_NODES:
                raise DatasetError(file, _line(node), None,
                                   f"the YAML expands to more than {MAX_NODES} values (through "
                                   "its aliases); an eval config is far smaller")
        active.discard(key)
        sizes[key] = total
        return total

    if root is not None:
        size(root)


def _dataset(
    file: str, base: str, entry: object, node: yaml.Node | None, shared: Mapping[str, Any]
) -> EvalDataset:
    if not isinstance(entry, dict):
        raise DatasetError(file, _line(node), None, "expected a mapping with name and path")
    own = {key: value for key, value in entry.items() if key not in ("name", "path")}
    settings = _settings(file, own, node, "dataset")
    for key in ("name", "path"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise DatasetError(file, _key_line(node, key) or _line(node), key,
                               f"every dataset needs a {key} (a string)")
    data_path = os.path.join(base, os.path.expanduser(entry["path"]))
    try:
        return EvalDataset.from_jsonl(data_path, name=entry["name"], **{**shared, **settings})
    except DatasetError as exc:
        if exc.path == data_path and exc.line is not None:
            raise
        setting = exc.key if exc.key in settings or exc.key in shared else None
        line = (_key_line(node, _source_key(entry, setting)) if setting else None) or _line(node)
        message = str(exc).removeprefix(f"{exc.path}: ").removeprefix(f"{exc.key}: ")
        raise DatasetError(file, line, exc.key, f"dataset {entry['name']!r}: {message}") from None


def _settings(
    file: str, raw: object, node: yaml.Node | None, owner: str
) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise DatasetError(file, _line(node), owner, "expected a mapping of settings")
    settings: dict[str, Any] = {}
    for key, value in raw.items():
        name = MILES_KEYS.get(key, key)
        if name not in SAMPLING_FIELDS:
            allowed = ", ".join(SAMPLING_FIELDS + tuple(MILES_KEYS))
            raise DatasetError(file, _key_line(node, key), str(key),
                               f"unknown {owner} setting; expected one of {allowed}")
        if name in settings:
            raise DatasetError(file, _key_line(node, key), str(key),
                               f"sets {name} twice (under two names)")
        settings[name] = value
    return settings


def _source_key(entry: Mapping[str, Any], field: str) -> str:
    for key in entry:
        if MILES_KEYS.get(key, key) == field:
            return str(key)
    return field


def _value_node(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if key_node.value == key:
                return value_node
    return None


def _key_line(node: yaml.Node | None, key: str) -> int | None:
    if isinstance(node, yaml.MappingNode):
        for key_node, _ in node.value:
            if key_node.value == key:
                return int(key_node.start_mark.line) + 1
    return None


def _line(node: yaml.Node | None) -> int | None:
    return None if node is None else int(node.start_mark.line) + 1


def check_settings(owner: str, settings: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` if ``settings`` holds a key no dataset has."""
    unknown = sorted(set(settings) - set(SAMPLING_FIELDS))
    if unknown:
        raise ConfigError(owner, f"unknown dataset settings {unknown}; expected {SAMPLING_FIELDS}")

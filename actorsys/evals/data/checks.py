"""What an :class:`~actorsys.evals.EvalDataset` must be: its settings and each of its records,
checked when it is built, each failure a :class:`~actorsys.evals.DatasetError` naming the file,
the line and the key (so a bad file fails at the start of training, not at its first
evaluation).

:func:`checked_settings` checks the settings and gives back the ones it normalizes;
:func:`check_record` checks one record against them (its prompt, tools, metadata and label).
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from actorsys._errors import ConfigError, DatasetError
from actorsys.evals.scoring.builtin import base_scorer, choice_index, needs_math, parse_number
from actorsys.evals.scoring.grading import RM_TYPE, record_scorer
from actorsys.evals.scoring.miles_rewards import dapo_label
from actorsys.evals.scoring.pool import pickling_problem
from actorsys.evals.scoring.scorers import Scorer, check_scorer
from actorsys.fleet.chat_template import check_messages, check_template_kwargs, check_tools


class DatasetSettings(Protocol):
    """The settings of a dataset these checks read (an :class:`~actorsys.evals.EvalDataset`'s
    fields; the checks run on the values given, whatever their type)."""

    @property
    def name(self) -> str: ...
    @property
    def input_key(self) -> str: ...
    @property
    def label_key(self) -> str: ...
    @property
    def n_samples(self) -> int: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def temperature(self) -> float: ...
    @property
    def top_p(self) -> float: ...
    @property
    def stop(self) -> tuple[str, ...] | None: ...
    @property
    def scorer(self) -> Scorer: ...
    @property
    def limit(self) -> int | None: ...
    @property
    def score_timeout(self) -> float: ...
    @property
    def interval(self) -> int | None: ...
    @property
    def apply_chat_template(self) -> bool: ...
    @property
    def chat_template_kwargs(self) -> Mapping[str, Any] | None: ...
    @property
    def tool_key(self) -> str | None: ...
    @property
    def metadata_key(self) -> str | None: ...
    @property
    def top_k(self) -> int | None: ...
    @property
    def rm_url(self) -> str | None: ...


def checked_settings(dataset: DatasetSettings, where: str) -> dict[str, Any]:
    """Check ``dataset``'s settings (all but its records; ``where`` names it in errors) and
    return those it normalizes: ``stop`` as a tuple, ``scorer`` checked, and
    ``chat_template_kwargs`` as a dict."""
    if not isinstance(dataset.name, str) or not dataset.name or "/" in dataset.name:
        raise DatasetError(where, None, "name", f"expected a non-empty name without '/', "
                                                f"got {dataset.name!r}")
    for key in ("input_key", "label_key"):
        if not isinstance(getattr(dataset, key), str) or not getattr(dataset, key):
            raise DatasetError(where, None, key, f"expected a key name, got "
                                                 f"{getattr(dataset, key)!r}")
    require_int(where, "n_samples", dataset.n_samples, minimum=1)
    require_int(where, "max_tokens", dataset.max_tokens, minimum=1)
    if dataset.limit is not None:
        require_int(where, "limit", dataset.limit, minimum=1)
    if dataset.interval is not None:
        require_int(where, "interval", dataset.interval, minimum=1)
    require_number(where, "temperature", dataset.temperature, low=0.0, low_open=False)
    require_number(where, "top_p", dataset.top_p, low=0.0, low_open=True, high=1.0)
    require_number(where, "score_timeout", dataset.score_timeout, low=0.0, low_open=True)
    stop = _checked_stop(where, dataset.stop)
    try:
        scorer = check_scorer(dataset.scorer)
    except ConfigError as exc:
        raise DatasetError(where, None, "scorer", str(exc).removeprefix("scorer: ")) from None
    problem = pickling_problem(scorer)
    if problem is not None:
        raise DatasetError(where, None, "scorer", problem)
    kwargs = _checked_chat_settings(dataset, where)
    need_scorer(where, None, "scorer", scorer, dataset.rm_url)
    return {"stop": stop, "scorer": scorer, "chat_template_kwargs": kwargs}


def check_record(dataset: DatasetSettings, where: str, line: int | None, record: object) -> None:
    """Check one record of ``dataset`` (``line`` of ``where``, None when it came from memory):
    an object with the prompt and the label, the prompt a non-empty string or chat messages,
    its tools and metadata well formed, its label one its scorer can use."""
    if not isinstance(record, Mapping):
        raise DatasetError(where, line, None, f"expected a JSON object, got {kind(record)}")
    for key, setting in ((dataset.input_key, "input_key"), (dataset.label_key, "label_key")):
        if key not in record:
            keys = ", ".join(map(str, record)) or "none"
            raise DatasetError(
                where, line, key,
                f"missing from the record (its keys: {keys}); set {setting} to the key that "
                "holds it",
            )
    prompt = record[dataset.input_key]
    if isinstance(prompt, list) and not dataset.apply_chat_template:
        raise DatasetError(
            where, line, dataset.input_key,
            "a list of chat messages needs apply_chat_template (--apply-chat-template), "
            "so that the snapshot's chat template renders it",
        )
    if isinstance(prompt, list):
        problem = check_messages(prompt)
        if problem is not None:
            raise DatasetError(where, line, dataset.input_key, problem)
    elif not isinstance(prompt, str) or not prompt:
        raise DatasetError(
            where, line, dataset.input_key,
            f"expected a non-empty string or a list of chat messages, got {kind(prompt)}",
        )
    if dataset.tool_key is not None and dataset.apply_chat_template:
        problem = check_tools(record.get(dataset.tool_key))
        if problem is not None:
            raise DatasetError(where, line, dataset.tool_key, problem)
    scorer = _record_scorer(dataset, where, line, record)
    label = record[dataset.label_key]
    name = base_scorer(scorer) if isinstance(scorer, str) else None
    try:
        if name == "numeric":
            parse_number(label)
        elif name == "choice":
            choice_index(label)
        elif name == "dapo":
            dapo_label(label)
    except ValueError as exc:
        raise DatasetError(
            where, line, dataset.label_key,
            f"{label!r} cannot be scored {scorer!r}: {exc}",
        ) from None


def _record_scorer(dataset: DatasetSettings, where: str, line: int | None,
                   record: Mapping[str, Any]) -> Scorer:
    """The scorer of ``record`` (its metadata's ``rm_type``, else the dataset's), checked."""
    if dataset.metadata_key is None:
        return dataset.scorer
    metadata = record.get(dataset.metadata_key)
    if metadata is not None and not isinstance(metadata, Mapping):
        raise DatasetError(where, line, dataset.metadata_key,
                           f"expected an object (the record's metadata), got {kind(metadata)}")
    # A record names only a built-in scorer (record_scorer): anything else is refused at
    # scoring, that record's scorer error, and is never imported here or in the workers.
    scorer = record_scorer(dataset.scorer, metadata)
    if scorer is not dataset.scorer:
        need_scorer(where, line, f"{dataset.metadata_key}.{RM_TYPE}", scorer, dataset.rm_url)
    return scorer


def _checked_chat_settings(dataset: DatasetSettings, where: str) -> dict[str, Any] | None:
    """Check the chat and reasoning settings; return ``chat_template_kwargs`` as a dict."""
    if not isinstance(dataset.apply_chat_template, bool):
        raise DatasetError(where, None, "apply_chat_template",
                           f"expected true or false, got {dataset.apply_chat_template!r}")
    kwargs = dataset.chat_template_kwargs
    if kwargs is not None:
        if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
            raise DatasetError(where, None, "chat_template_kwargs",
                               f"expected an object of keyword arguments, got {kwargs!r}")
        try:
            json.dumps(dict(kwargs))
        except (TypeError, ValueError, RecursionError) as exc:
            raise DatasetError(where, None, "chat_template_kwargs",
                               f"expected JSON values: {exc}") from None
        problem = check_template_kwargs(kwargs)
        if problem is not None:
            key, _, message = problem.partition(": ")
            raise DatasetError(where, None, key, message)
        kwargs = dict(kwargs)
    for key in ("tool_key", "metadata_key"):
        value = getattr(dataset, key)
        if value is not None and (not isinstance(value, str) or not value):
            raise DatasetError(where, None, key, f"expected a key name, got {value!r}")
    if dataset.top_k is not None:
        require_int(where, "top_k", dataset.top_k, minimum=-1)
    url = dataset.rm_url
    if url is not None and (not isinstance(url, str)
                            or not url.startswith(("http://", "https://"))):
        raise DatasetError(where, None, "rm_url", f"expected an http(s) URL, got {url!r}")
    return kwargs


def need_scorer(where: str, line: int | None, key: str, scorer: Scorer,
                rm_url: str | None) -> None:
    """What a scorer needs beyond its name: math-verify, a reward server."""
    if needs_math(scorer) and importlib.util.find_spec("math_verify") is None:
        raise DatasetError(where, line, key, f"the {scorer} scorer needs math-verify: "
                                             "pip install 'actorsys[math]'")
    if isinstance(scorer, str) and base_scorer(scorer) == "remote_rm" and not rm_url:
        raise DatasetError(where, line, key, "remote_rm grades through a reward server: set "
                                             "rm_url (--rm-url)")


def kind(value: object) -> str:
    """What ``value`` is, in the words of a message (``"a string"``, ``"null"``...)."""
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    return {dict: "an object", list: "a list", type(None): "null", bool: "a boolean"}.get(
        type(value), f"a {type(value).__name__}"
    )


def require_int(where: str, key: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DatasetError(where, None, key, f"expected an integer >= {minimum}, got {value!r}")


def require_number(
    where: str, key: str, value: object, *, low: float, low_open: bool, high: float | None = None
) -> None:
    ok = (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and (value > low if low_open else value >= low)
        and (high is None or value <= high)
    )
    if not ok:
        bound = f"in ({low}, {high}]" if high is not None else f">= {low}"
        raise DatasetError(where, None, key, f"expected a number {bound}, got {value!r}")


def _checked_stop(where: str, stop: object) -> tuple[str, ...] | None:
    if stop is None:
        return None
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, Sequence) or not all(isinstance(s, str) and s for s in stop):
        raise DatasetError(where, None, "stop", f"expected a list of non-empty strings, got "
                                                f"{stop!r}")
    return tuple(stop) or None

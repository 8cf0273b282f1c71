"""EvalDataset: the one definition of what to evaluate, shared by every path (the pipeline's
fleet, an external server, the watch service).

A dataset is a list of records (JSON objects), the keys of the prompt and the label in them,
how to sample (``n_samples`` per prompt, ``max_tokens``, ``temperature``, ``top_p``, ``top_k``,
``stop``) and how to grade (``scorer``, a record's own ``rm_type`` under ``metadata_key``)::

    math = EvalDataset.from_jsonl("data/math.jsonl", scorer="math", n_samples=4, temperature=0.7)

A chat or reasoning model is evaluated on the prompt its chat template makes, as it is trained
(miles' ``--apply-chat-template``)::

    aime = EvalDataset.from_jsonl("aime.jsonl", input_key="messages", apply_chat_template=True,
                                  chat_template_kwargs={"enable_thinking": False},
                                  tool_key="tools", metadata_key="metadata", scorer="deepscaler")

The prompt under ``input_key`` is then a string (one user message) or a list of chat messages,
rendered at each evaluation by the tokenizer of the snapshot being evaluated
(:mod:`actorsys.evals.prompts`).

Everything is checked when the dataset is built, so a bad file fails at the start of training,
not at its first evaluation: :class:`DatasetError` (a :class:`~actorsys.ConfigError`) names the
file, the line and the key.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from actorsys._errors import ConfigError
from actorsys.evals.grading import RM_TYPE, record_scorer
from actorsys.evals.miles_rewards import dapo_label
from actorsys.evals.scorers import (
    Scorer,
    base_scorer,
    check_scorer,
    choice_index,
    needs_math,
    parse_number,
    scorer_name,
)
from actorsys.evals.scoring_pool import pickling_problem
from actorsys.fleet.chat_template import check_messages, check_tools

CHAT_FIELDS = ("apply_chat_template", "chat_template_kwargs", "tool_key", "metadata_key",
               "top_k", "rm_url")
"""The settings of chat and reasoning evaluations (they enter a dataset's fingerprint only
when set, so the evaluations defined before them keep theirs)."""
SAMPLING_FIELDS = ("input_key", "label_key", "n_samples", "max_tokens", "temperature", "top_p",
                   "stop", "scorer", "limit", "score_timeout", *CHAT_FIELDS)
"""The settings of a dataset beyond its name and records (what ``defaults`` may set)."""


MAX_MESSAGE = 2000
"""The longest message a :class:`DatasetError` carries; longer ones are cut."""


class DatasetError(ConfigError):
    """A dataset file (or eval config) is unusable. ``path``, ``line`` (1-based, or None) and
    ``key`` (the record key or setting at fault, or None) say where."""

    def __init__(self, path: str, line: int | None, key: str | None, message: str) -> None:
        if len(message) > MAX_MESSAGE:  # an excerpt of bad input, never all of it
            message = f"{message[:MAX_MESSAGE]}... ({len(message)} characters)"
        where = path if line is None else f"{path}, line {line}"
        Exception.__init__(self, f"{where}: {message}" if key is None else f"{where}: {key}: {message}")
        self.field = key or "path"
        self.path = path
        self.line = line
        self.key = key


@dataclass(frozen=True, kw_only=True)
class EvalDataset:
    """One evaluation set and how to sample and score it.

    Build it with :meth:`from_jsonl` (or :func:`~actorsys.evals.load_eval_config`); the
    constructor takes ``records`` in memory. Every prompt is sampled ``n_samples`` times
    (pass@k needs several samples; with ``temperature=0`` they are all the greedy answer).
    Each answer is scored in a worker process within ``score_timeout`` seconds (one past it
    scores 0, counted in ``eval/<name>/scorer_errors``), so a callable ``scorer`` must pickle.

    Chat and reasoning models: with ``apply_chat_template`` the prompt (a string, or a list of
    chat messages) is rendered by the evaluated snapshot's own chat template, with the record's
    tools (``tool_key``), ``chat_template_kwargs`` and the generation prompt, and sent as the
    template's token ids. ``metadata_key`` names the record's metadata (its ``rm_type``
    overrides ``scorer`` for that record, unless ``scorer`` is a custom one, as in miles);
    ``top_k`` limits sampling (-1 or 0: off); ``rm_url``
    is the reward server of ``remote_rm``.
    """

    name: str
    records: tuple[Mapping[str, Any], ...]
    path: str | None = None
    input_key: str = "prompt"
    label_key: str = "label"
    n_samples: int = 1
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] | None = None
    scorer: Scorer = "exact"
    limit: int | None = None
    score_timeout: float = 10.0
    apply_chat_template: bool = False
    chat_template_kwargs: Mapping[str, Any] | None = None
    tool_key: str | None = None
    metadata_key: str | None = None
    top_k: int | None = None
    rm_url: str | None = None
    _lines: tuple[int, ...] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = self.path or f"dataset {self.name!r}"
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise DatasetError(where, None, "name", f"expected a non-empty name without '/', "
                                                    f"got {self.name!r}")
        for key in ("input_key", "label_key"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise DatasetError(where, None, key, f"expected a key name, got "
                                                     f"{getattr(self, key)!r}")
        _require_int(where, "n_samples", self.n_samples, minimum=1)
        _require_int(where, "max_tokens", self.max_tokens, minimum=1)
        if self.limit is not None:
            _require_int(where, "limit", self.limit, minimum=1)
        _require_number(where, "temperature", self.temperature, low=0.0, low_open=False)
        _require_number(where, "top_p", self.top_p, low=0.0, low_open=True, high=1.0)
        _require_number(where, "score_timeout", self.score_timeout, low=0.0, low_open=True)
        object.__setattr__(self, "stop", _check_stop(where, self.stop))
        try:
            object.__setattr__(self, "scorer", check_scorer(self.scorer))
        except ConfigError as exc:
            raise DatasetError(where, None, "scorer", str(exc).removeprefix("scorer: ")) from None
        problem = pickling_problem(self.scorer)
        if problem is not None:
            raise DatasetError(where, None, "scorer", problem)
        self._check_chat_settings(where)
        _need_scorer(where, None, "scorer", self.scorer, self.rm_url)
        records = tuple(self.records)
        if self.limit is not None:
            records = records[: self.limit]
        if not records:
            raise DatasetError(where, None, None, "has no records")
        lines = self._lines or tuple(range(1, len(records) + 1))
        for record, line in zip(records, lines, strict=False):
            self._check_record(where, line if self.path else None, record)
        object.__setattr__(self, "records", records)

    @classmethod
    def from_jsonl(
        cls,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        input_key: str = "prompt",
        label_key: str = "label",
        n_samples: int = 1,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] | str | None = None,
        scorer: Scorer = "exact",
        limit: int | None = None,
        score_timeout: float = 10.0,
        apply_chat_template: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tool_key: str | None = None,
        metadata_key: str | None = None,
        top_k: int | None = None,
        rm_url: str | None = None,
    ) -> EvalDataset:
        """Read a JSONL file (one JSON object a line; blank lines are skipped); ``name``
        defaults to the file's stem. Reads at most ``limit`` records. Raises
        :class:`DatasetError` naming the file and line for a file that cannot be read, a line
        that is not a JSON object, a missing key, a prompt that is not a string, or a label
        the scorer cannot use, a list of messages without ``apply_chat_template``, a bad
        ``rm_type`` in a record's metadata. Blocking (reads the file)."""
        text_path = os.fspath(path)
        records, lines = _read_jsonl(text_path, limit)
        return cls(
            name=name if name is not None else os.path.splitext(os.path.basename(text_path))[0],
            records=tuple(records),
            path=text_path,
            input_key=input_key,
            label_key=label_key,
            n_samples=n_samples,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=tuple([stop] if isinstance(stop, str) else stop) if stop is not None else None,
            scorer=scorer,
            limit=limit,
            score_timeout=score_timeout,
            apply_chat_template=apply_chat_template,
            chat_template_kwargs=chat_template_kwargs,
            tool_key=tool_key,
            metadata_key=metadata_key,
            top_k=top_k,
            rm_url=rm_url,
            _lines=tuple(lines),
        )

    @property
    def prompts(self) -> list[Any]:
        """The records' prompts as given: strings, or lists of chat messages."""
        return [record[self.input_key] for record in self.records]

    def messages(self, index: int) -> list[dict[str, Any]]:
        """Record ``index``'s prompt as a conversation (a string is one user message)."""
        prompt = self.records[index][self.input_key]
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}]
        return [dict(message) for message in prompt]

    def tools(self, index: int) -> list[dict[str, Any]] | None:
        """Record ``index``'s tool schemas (``tool_key``), or None (also without
        ``apply_chat_template``: tools reach a model only through its chat template)."""
        if self.tool_key is None or not self.apply_chat_template:
            return None
        tools = self.records[index].get(self.tool_key)
        return [dict(tool) for tool in tools] if tools else None

    def metadata(self, index: int) -> dict[str, Any]:
        """Record ``index``'s metadata (``metadata_key``), or an empty dict."""
        if self.metadata_key is None:
            return {}
        return dict(self.records[index].get(self.metadata_key) or {})

    def scorer_of(self, index: int) -> Scorer:
        """The scorer of record ``index``: its metadata's ``rm_type``, else ``scorer``."""
        return record_scorer(self.scorer, self.metadata(index))

    @property
    def labels(self) -> list[Any]:
        return [record[self.label_key] for record in self.records]

    def sampling_kwargs(self) -> dict[str, Any]:
        """The request settings of this dataset, as ``Fleet.complete`` takes them."""
        extra: dict[str, Any] = {"top_p": self.top_p}
        if self.top_k is not None and self.top_k > 0:
            extra["top_k"] = self.top_k
        if self.stop:
            extra["stop"] = list(self.stop)
        return {"max_tokens": self.max_tokens, "temperature": self.temperature, "extra": extra}

    def fingerprint(self) -> str:
        """A hash of everything that decides this dataset's scores (its records and settings),
        stable across processes: equal fingerprints mean the same evaluation."""
        settings = {
            "name": self.name,
            **{key: getattr(self, key) for key in SAMPLING_FIELDS
               if key != "scorer" and key not in CHAT_FIELDS},
            **{key: getattr(self, key) for key in CHAT_FIELDS
               if getattr(self, key) not in (None, False)},
            "scorer": scorer_name(self.scorer),
            "records": list(self.records),
        }
        payload = json.dumps(settings, sort_keys=True, default=repr).encode()
        return hashlib.sha256(payload).hexdigest()

    def _check_record(self, where: str, line: int | None, record: object) -> None:
        if not isinstance(record, Mapping):
            raise DatasetError(where, line, None, f"expected a JSON object, got {_kind(record)}")
        for key, setting in ((self.input_key, "input_key"), (self.label_key, "label_key")):
            if key not in record:
                keys = ", ".join(map(str, record)) or "none"
                raise DatasetError(
                    where, line, key,
                    f"missing from the record (its keys: {keys}); set {setting} to the key that "
                    "holds it",
                )
        prompt = record[self.input_key]
        if isinstance(prompt, list) and not self.apply_chat_template:
            raise DatasetError(
                where, line, self.input_key,
                "a list of chat messages needs apply_chat_template (--apply-chat-template), "
                "so that the snapshot's chat template renders it",
            )
        if isinstance(prompt, list):
            problem = check_messages(prompt)
            if problem is not None:
                raise DatasetError(where, line, self.input_key, problem)
        elif not isinstance(prompt, str) or not prompt:
            raise DatasetError(
                where, line, self.input_key,
                f"expected a non-empty string or a list of chat messages, got {_kind(prompt)}",
            )
        if self.tool_key is not None and self.apply_chat_template:
            problem = check_tools(record.get(self.tool_key))
            if problem is not None:
                raise DatasetError(where, line, self.tool_key, problem)
        scorer = self.scorer
        if self.metadata_key is not None:
            metadata = record.get(self.metadata_key)
            if metadata is not None and not isinstance(metadata, Mapping):
                raise DatasetError(where, line, self.metadata_key,
                                   f"expected an object (the record's metadata), got {_kind(metadata)}")
            scorer = record_scorer(self.scorer, metadata)
            if scorer is not self.scorer:
                try:
                    scorer = check_scorer(scorer, field=RM_TYPE)
                except ConfigError as exc:
                    raise DatasetError(where, line, f"{self.metadata_key}.{RM_TYPE}",
                                       str(exc).removeprefix(f"{RM_TYPE}: ")) from None
                _need_scorer(where, line, f"{self.metadata_key}.{RM_TYPE}", scorer, self.rm_url)
        label = record[self.label_key]
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
                where, line, self.label_key,
                f"{label!r} cannot be scored {scorer!r}: {exc}",
            ) from None

    def _check_chat_settings(self, where: str) -> None:
        if not isinstance(self.apply_chat_template, bool):
            raise DatasetError(where, None, "apply_chat_template",
                               f"expected true or false, got {self.apply_chat_template!r}")
        kwargs = self.chat_template_kwargs
        if kwargs is not None:
            if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
                raise DatasetError(where, None, "chat_template_kwargs",
                                   f"expected an object of keyword arguments, got {kwargs!r}")
            try:
                json.dumps(dict(kwargs))
            except (TypeError, ValueError) as exc:
                raise DatasetError(where, None, "chat_template_kwargs",
                                   f"expected JSON values: {exc}") from None
            object.__setattr__(self, "chat_template_kwargs", dict(kwargs))
        for key in ("tool_key", "metadata_key"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value):
                raise DatasetError(where, None, key, f"expected a key name, got {value!r}")
        if self.top_k is not None:
            _require_int(where, "top_k", self.top_k, minimum=-1)
        url = self.rm_url
        if url is not None and (not isinstance(url, str)
                                or not url.startswith(("http://", "https://"))):
            raise DatasetError(where, None, "rm_url", f"expected an http(s) URL, got {url!r}")


def _need_scorer(where: str, line: int | None, key: str, scorer: Scorer,
                 rm_url: str | None) -> None:
    """What a scorer needs beyond its name: math-verify, a reward server."""
    if needs_math(scorer) and importlib.util.find_spec("math_verify") is None:
        raise DatasetError(where, line, key, f"the {scorer} scorer needs math-verify: "
                                             "pip install 'actorsys[math]'")
    if isinstance(scorer, str) and base_scorer(scorer) == "remote_rm" and not rm_url:
        raise DatasetError(where, line, key, "remote_rm grades through a reward server: set "
                                             "rm_url (--rm-url)")


def _read_jsonl(path: str, limit: int | None) -> tuple[list[Any], list[int]]:
    records: list[Any] = []
    lines: list[int] = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, text in enumerate(f, start=1):
                if limit is not None and len(records) >= limit:
                    break
                if not text.strip():
                    continue
                try:
                    records.append(json.loads(text))
                except ValueError as exc:
                    raise DatasetError(path, number, None, f"invalid JSON: {exc}") from None
                except RecursionError:
                    raise DatasetError(path, number, None, "JSON nested too deeply") from None
                lines.append(number)
    except FileNotFoundError:
        raise DatasetError(path, None, None, "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(path, None, None, f"cannot be read: {exc}") from None
    return records, lines


def _kind(value: object) -> str:
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    return {dict: "an object", list: "a list", type(None): "null", bool: "a boolean"}.get(
        type(value), f"a {type(value).__name__}"
    )


def _require_int(where: str, key: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DatasetError(where, None, key, f"expected an integer >= {minimum}, got {value!r}")


def _require_number(
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


def _check_stop(where: str, stop: object) -> tuple[str, ...] | None:
    if stop is None:
        return None
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, Sequence) or not all(isinstance(s, str) and s for s in stop):
        raise DatasetError(where, None, "stop", f"expected a list of non-empty strings, got "
                                                f"{stop!r}")
    return tuple(stop) or None

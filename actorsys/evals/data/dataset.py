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
(:mod:`actorsys.evals.data.prompts`).

Everything is checked when the dataset is built, so a bad file fails at the start of training,
not at its first evaluation: :class:`DatasetError` (a :class:`~actorsys.ConfigError`) names the
file, the line and the key.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from actorsys._errors import DatasetError
from actorsys.evals.data.checks import check_record, checked_settings
from actorsys.evals.scoring.grading import record_scorer
from actorsys.evals.scoring.scorers import Scorer, scorer_name

CHAT_FIELDS = ("apply_chat_template", "chat_template_kwargs", "tool_key", "metadata_key",
               "top_k", "rm_url")
"""The settings of chat and reasoning evaluations (they enter a dataset's fingerprint only
when set, so the evaluations defined before them keep theirs)."""
CADENCE_FIELDS = ("interval",)
"""When a dataset is evaluated (it enters the fingerprint only when set, like ``CHAT_FIELDS``:
a changed cadence makes a watched checkpoint due again)."""
SAMPLING_FIELDS = ("input_key", "label_key", "n_samples", "max_tokens", "temperature", "top_p",
                   "stop", "scorer", "limit", "score_timeout", *CHAT_FIELDS, *CADENCE_FIELDS)
"""The settings of a dataset beyond its name and records (what ``defaults`` may set)."""


MAX_MESSAGE = DatasetError.MAX_MESSAGE
"""The longest message a :class:`DatasetError` carries; longer ones are cut."""

__all__ = ["CADENCE_FIELDS", "CHAT_FIELDS", "MAX_MESSAGE", "SAMPLING_FIELDS", "DatasetError", "EvalDataset"]


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
    overrides ``scorer`` for that record, unless ``scorer`` is a custom one, as in miles; a
    record names only built-in scorers: any other ``rm_type`` is that record's scorer error);
    ``top_k`` limits sampling (-1 or 0: off); ``rm_url``
    is the reward server of ``remote_rm``.

    ``interval``: the dataset is evaluated only at points whose step is a multiple of it
    (:meth:`due`), on every path, so that an expensive set runs at every tenth point and a
    cheap one at each; None: at every point.
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
    interval: int | None = None
    _lines: tuple[int, ...] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = self.path or f"dataset {self.name!r}"
        for key, value in checked_settings(self, where).items():
            object.__setattr__(self, key, value)
        records = tuple(self.records)
        if self.limit is not None:
            records = records[: self.limit]
        if not records:
            raise DatasetError(where, None, None, "has no records")
        lines = self._lines or tuple(range(1, len(records) + 1))
        for record, line in zip(records, lines, strict=False):
            check_record(self, where, line if self.path else None, record)
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
        interval: int | None = None,
    ) -> EvalDataset:
        """Read a JSONL file (one JSON object a line; blank lines are skipped); ``name``
        defaults to the file's stem. Reads at most ``limit`` records. Raises
        :class:`DatasetError` naming the file and line for a file that cannot be read, a line
        that is not a JSON object, a missing key, a prompt that is not a string, or a label
        the scorer cannot use, or a list of messages without ``apply_chat_template``; a
        record's ``rm_type`` that names no built-in scorer is that record's scorer error when
        it is graded, not an error here. Blocking (reads the file)."""
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
            interval=interval,
            _lines=tuple(lines),
        )

    def due(self, step: int) -> bool:
        """Whether the point of ``step`` evaluates this dataset: ``step`` is a multiple of
        ``interval`` (always, without one)."""
        return self.interval is None or step % self.interval == 0

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
               if key != "scorer" and key not in CHAT_FIELDS + CADENCE_FIELDS},
            **{key: getattr(self, key) for key in CHAT_FIELDS + CADENCE_FIELDS
               if getattr(self, key) not in (None, False)},
            "scorer": scorer_name(self.scorer),
            "records": list(self.records),
        }
        payload = json.dumps(settings, sort_keys=True, default=repr).encode()
        return hashlib.sha256(payload).hexdigest()


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

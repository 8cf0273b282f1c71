"""EvalDataset: the one definition of what to evaluate, shared by every path (the pipeline's
fleet, an external server, the watch service).

A dataset is a list of records (JSON objects), the keys of the prompt and the label in them,
how to sample (``n_samples`` per prompt, ``max_tokens``, ``temperature``, ``top_p``, ``stop``)
and how to grade (``scorer``)::

    math = EvalDataset.from_jsonl("data/math.jsonl", scorer="math", n_samples=4, temperature=0.7)

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
from actorsys.evals.scorers import (
    Scorer,
    check_scorer,
    choice_index,
    parse_number,
    scorer_name,
)
from actorsys.evals.scoring_pool import pickling_problem

SAMPLING_FIELDS = ("input_key", "label_key", "n_samples", "max_tokens", "temperature", "top_p",
                   "stop", "scorer", "limit", "score_timeout")
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
        if self.scorer == "math" and importlib.util.find_spec("math_verify") is None:
            raise DatasetError(where, None, "scorer", "the math scorer needs math-verify: "
                                                      "pip install 'actorsys[math]'")
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
    ) -> EvalDataset:
        """Read a JSONL file (one JSON object a line; blank lines are skipped); ``name``
        defaults to the file's stem. Reads at most ``limit`` records. Raises
        :class:`DatasetError` naming the file and line for a file that cannot be read, a line
        that is not a JSON object, a missing key, a prompt that is not a string, or a label
        the scorer cannot use. Blocking (reads the file)."""
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
            _lines=tuple(lines),
        )

    @property
    def prompts(self) -> list[str]:
        return [record[self.input_key] for record in self.records]

    @property
    def labels(self) -> list[Any]:
        return [record[self.label_key] for record in self.records]

    def sampling_kwargs(self) -> dict[str, Any]:
        """The request settings of this dataset, as ``Fleet.complete`` takes them."""
        extra: dict[str, Any] = {"top_p": self.top_p}
        if self.stop:
            extra["stop"] = list(self.stop)
        return {"max_tokens": self.max_tokens, "temperature": self.temperature, "extra": extra}

    def fingerprint(self) -> str:
        """A hash of everything that decides this dataset's scores (its records and settings),
        stable across processes: equal fingerprints mean the same evaluation."""
        settings = {
            "name": self.name,
            **{key: getattr(self, key) for key in SAMPLING_FIELDS if key != "scorer"},
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
        if not isinstance(prompt, str) or not prompt:
            raise DatasetError(
                where, line, self.input_key,
                f"expected a non-empty string, got {_kind(prompt)}",
            )
        label = record[self.label_key]
        try:
            if self.scorer == "numeric":
                parse_number(label)
            elif self.scorer == "choice":
                choice_index(label)
        except ValueError as exc:
            raise DatasetError(
                where, line, self.label_key,
                f"{label!r} cannot be scored {self.scorer!r}: {exc}",
            ) from None


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

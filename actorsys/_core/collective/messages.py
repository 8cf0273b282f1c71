"""The messages ranks leave in the job's store for a collective submit, and their checks.

Every message another rank wrote is untrusted: one that is not JSON, not UTF-8, not of the
expected shape, or that names a file outside ``hf_dir`` is a :class:`_PeerGoneError` (a skip),
never a traceback or a write elsewhere. The protocol that exchanges them is
:mod:`actorsys._core.collective.protocol`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any


class _PeerGoneError(Exception):
    """Another rank did not answer within ``collective_timeout`` (it died, hung or closed),
    or the job's store held a malformed message where its answer belongs (not JSON, not
    UTF-8, not the expected shape, or a file outside ``hf_dir``): either way a skip."""


MAX_MESSAGE_EXCERPT = 80


def malformed(key: str, text: object, problem: str) -> _PeerGoneError:
    excerpt = repr(text)[:MAX_MESSAGE_EXCERPT]
    return _PeerGoneError(f"the message {key!r} in the job's store is malformed ({problem}): "
                         f"{excerpt}")


def parse_json(key: str, text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise malformed(key, text, f"not JSON: {exc}") from None


def inside(path: str, root: str) -> bool:
    """Whether ``path`` lies strictly inside ``root`` once links are resolved."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path != root and os.path.commonpath([path, root]) == root


def checked_ready(key: str, ready: Any, hf_dir: str | None) -> tuple[str, dict[str, dict[str, int]]]:
    """The ``ready/<step>`` message ``ready`` (parsed JSON, not None) as (directory, starts),
    or :class:`_PeerGoneError`: the directory must lie inside ``hf_dir``, every file name be a
    plain name of that directory, every start a non-negative integer. (The writer checks
    that each range ends inside its file.)"""
    if not isinstance(ready, dict) or not isinstance(ready.get("directory"), str):
        raise malformed(key, ready, "expected {'directory': ..., 'starts': ...}")
    directory, starts = ready["directory"], ready.get("starts")
    if hf_dir is None or not os.path.isabs(directory) or not inside(directory, hf_dir):
        raise malformed(key, directory, f"the directory is not inside hf_dir {hf_dir}")
    if not isinstance(starts, dict):
        raise malformed(key, starts, "expected the starts as an object")
    for filename, names in starts.items():
        plain = (filename not in ("", ".", "..") and "/" not in filename and "\0" not in filename)
        if not plain:
            raise malformed(key, filename, "a file name that is not a plain name")
        if not isinstance(names, dict) or not all(
            isinstance(n, str) and type(at) is int and at >= 0 for n, at in names.items()
        ):
            raise malformed(key, names, "expected tensor names with non-negative offsets")
    return directory, starts


@dataclass(frozen=True)
class Decision:
    step: int
    admitted: bool
    error: str | None = None


def parse_decision(key: str, text: str) -> Decision:
    """The ``decision/<n>`` message ``text``: ``[step, admitted, error]``."""
    decision = parse_json(key, text)
    if not (
        isinstance(decision, list) and len(decision) == 3
        and type(decision[0]) is int and isinstance(decision[1], bool)
        and (decision[2] is None or isinstance(decision[2], str))
    ):
        raise malformed(key, decision, "expected [step, admitted, error]")
    step, admitted, error = decision
    return Decision(step, admitted, error)

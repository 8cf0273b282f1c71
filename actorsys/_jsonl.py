"""JSON Lines files of ours: appending whole lines durably, reading past a torn one.

The metrics file (:class:`~actorsys.sinks.JsonlSink`, ``watch``'s ``metrics.jsonl``) and the
watch ledger are one JSON object a line. :func:`append_lines` writes lines in one ``write`` on
a file opened for appending (through :func:`~actorsys._files.open_private`: never through a
link), then fsyncs it (the ledger, which a restart resumes from; a sink's lines only reach the
OS), so a crash leaves at most a torn last line; a file whose last line is torn gets a newline
first, so the next line starts whole. :func:`read_lines` reads every line,
giving each JSON object with its line number, or the reason a line is none (torn, another
JSON value, nested too deeply to parse), for the caller to warn about and skip. Blocking.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from actorsys._files import open_private

__all__ = ["Line", "append_lines", "encode_line", "read_lines"]


def encode_line(row: Mapping[str, Any]) -> str:
    """``row`` as one line of JSON (values JSON cannot hold as their ``repr``), newline ended."""
    return json.dumps(row, default=repr) + "\n"


def append_lines(path: str, lines: Sequence[str], *, fsync: bool = True) -> None:
    """Append ``lines`` (each newline ended, from :func:`encode_line`) to ``path`` in one
    write, then fsync it (unless ``fsync`` is false: the lines then survive a crash of this
    process, not of the machine); the file is created if missing. Raises ``OSError`` or
    :class:`~actorsys._errors.UnsafePathError`. Blocking (disk I/O and fsync): callers run it
    in a worker thread (the ledger's writes through watch's ``run_blocking``, JsonlSink in
    its writer thread), never on the trio thread."""
    if not lines:
        return
    fd = open_private(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    try:
        size = os.fstat(fd).st_size
        data = "".join(lines).encode()
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Line:
    """Line ``number`` (from 1) of a file: its JSON object (``row``), or why it is none."""

    number: int
    row: dict[str, Any] | None
    problem: str | None = None


def read_lines(path: str | os.PathLike[str], *, private: bool = False) -> list[Line]:
    """The non-blank lines of ``path``, in order (undecodable bytes replaced). With
    ``private``, the file is one of ours, opened as :func:`open_private` opens it; otherwise
    (a file a user names, to read) plainly. Raises ``OSError`` if it cannot be opened."""
    if private:
        file = os.fdopen(open_private(os.fspath(path), os.O_RDONLY), "rb")
    else:
        file = open(path, "rb")  # noqa: SIM115  # closed by the with below
    with file:
        data = file.read()
    texts = data.decode("utf-8", errors="replace").split("\n")
    return [_line(number, text) for number, text in enumerate(texts, start=1) if text.strip()]


def _line(number: int, text: str) -> Line:
    try:
        row = json.loads(text)
    except RecursionError:
        return Line(number, None, "JSON nested too deeply to parse")
    except ValueError as exc:
        return Line(number, None, f"not JSON: {exc}")
    if not isinstance(row, dict):
        return Line(number, None, f"a JSON {type(row).__name__}, not an object")
    return Line(number, row)

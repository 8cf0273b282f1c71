"""The watch ledger: ``OUT/ledger.jsonl``, an append-only record of evaluation attempts.

Each line is one JSON object: ``checkpoint`` (the directory's name), ``fingerprint`` (of its
weight files: see :func:`actorsys.watch.scan.fingerprint`), ``step``, ``eval_key`` (a hash of
the eval settings), ``status`` and, where it applies, ``reason`` and ``attempt``. Statuses:
``ok`` (done), ``skipped`` (an attempt that failed; retried), ``failed`` (the last allowed
attempt failed, or one that can never succeed; never retried), ``vanished`` (deleted before
its evaluation).

A checkpoint is known by its name and its fingerprint together: one rewritten in place, or
another run's checkpoint of the same name, is due again. A changed ``eval_key`` (a new
dataset, other settings) makes every checkpoint due again.

Lines are written and read as every JSONL file of ours is (:mod:`actorsys._jsonl`): whole, in
one fsynced append, so a crash leaves at most a torn last line; reading ignores any line that
is not a ledger entry, and the next append starts a new line after it.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from actorsys._jsonl import append_lines, encode_line, read_lines

log = logging.getLogger("actorsys.watch")

Key = tuple[str, str, str]
"""(checkpoint name, fingerprint, eval key)"""
DONE = "ok"
SKIPPED = "skipped"
FAILED = "failed"
VANISHED = "vanished"
TERMINAL = (DONE, FAILED)


@dataclass
class History:
    """What the ledger says about one checkpoint under one eval key."""

    attempts: int = 0
    status: str | None = None

    @property
    def settled(self) -> bool:
        return self.status in TERMINAL


class Ledger:
    """The ledger at ``path`` (created on the first write). Loading reads it whole: blocking,
    as :meth:`write` is; the rest works in memory."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._histories: dict[Key, History] = defaultdict(History)
        self._load()

    def history(self, checkpoint: str, fingerprint: str, eval_key: str) -> History:
        return self._histories.get((checkpoint, fingerprint, eval_key), History())

    def due(self, checkpoint: str, fingerprint: str, eval_key: str, max_attempts: int) -> bool:
        """Whether ``checkpoint`` (as it is now: ``fingerprint``) still needs an evaluation
        under ``eval_key``."""
        history = self.history(checkpoint, fingerprint, eval_key)
        return not history.settled and history.attempts < max_attempts

    def note(
        self, checkpoint: str, fingerprint: str, step: int, eval_key: str, status: str,
        **fields: Any,
    ) -> str:
        """Take one entry into the ledger's memory and return its line, for :meth:`write`."""
        history = self._histories[(checkpoint, fingerprint, eval_key)]
        if status == SKIPPED:
            history.attempts += 1
            fields.setdefault("attempt", history.attempts)
        elif status == DONE:
            fields.setdefault("attempt", history.attempts + 1)
        history.status = status
        entry = {"checkpoint": checkpoint, "fingerprint": fingerprint, "step": step,
                 "eval_key": eval_key, "status": status, **fields, "time": round(time.time(), 3)}
        return encode_line(entry)

    def write(self, lines: Sequence[str]) -> None:
        """Append ``lines`` (from :meth:`note`) in one write, and fsync. Blocking."""
        append_lines(self.path, lines)

    def _load(self) -> None:
        try:
            lines = read_lines(self.path, private=True)
        except FileNotFoundError:
            return
        for line in lines:
            entry = line.row
            if entry is None or not {"checkpoint", "eval_key", "status"} <= entry.keys():
                log.warning("%s line %d is torn or not a ledger entry; ignored", self.path,
                            line.number)
                continue
            key = (str(entry["checkpoint"]), str(entry.get("fingerprint", "")), str(entry["eval_key"]))
            history = self._histories[key]
            status = str(entry["status"])
            if status == SKIPPED:
                history.attempts += 1
            history.status = status

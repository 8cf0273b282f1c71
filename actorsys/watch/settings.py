"""What a watch run is given and gives back: its settings, its report, the rows it writes to
``metrics.jsonl``, and the key of its eval settings."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from actorsys.config import EvalConfig
from actorsys.outcome import Outcome
from actorsys.watch.policy import Catchup

WATCH_OWNED_FIELDS = ("hf_dir", "save_hf", "base_checkpoint", "max_in_flight", "overflow",
                      "keep_snapshots", "resume", "shared_update", "shared_update_timeout")
"""The :class:`EvalConfig` fields the watcher sets itself or has no use for: it evaluates
checkpoints in place, one per fleet at a time, never drops or deletes one, resumes from its
own ledger, and never evaluates served weights (shared mode is a trainer's)."""


@dataclass(frozen=True)
class WatchSettings:
    """``config``: the eval settings (timeouts, probe, ...), as a trainer's flags give them;
    the fields in ``WATCH_OWNED_FIELDS`` are the watcher's own. ``marker`` and
    ``quiet_seconds``: when a checkpoint is complete (see :class:`Completion`)."""

    root: str
    out: str
    catchup: Catchup = "all"
    once: bool = False
    poll_interval: float = 10.0
    quiet_seconds: float | None = None
    marker: str | None = None
    max_attempts: int = 3
    config: EvalConfig = field(default_factory=EvalConfig)


@dataclass(frozen=True)
class WatchedOutcome(Outcome):
    """An outcome as ``metrics.jsonl`` keeps it: with the checkpoint's name and fingerprint,
    the attempt and the eval key."""

    checkpoint: str = ""
    fingerprint: str = ""
    attempt: int | None = None
    eval_key: str = ""


@dataclass
class WatchReport:
    """What one run of the service did: steps evaluated ok, failed for good, vanished; and
    whether it was interrupted."""

    ok: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    vanished: list[int] = field(default_factory=list)
    interrupted: bool = False


def eval_key(datasets: Sequence[Any]) -> str:
    """A short hash of the eval settings: every dataset's fingerprint (records and sampling
    settings), so a new dataset or a changed setting makes every checkpoint due again."""
    payload = json.dumps(sorted(dataset.fingerprint() for dataset in datasets)).encode()
    return hashlib.sha256(payload).hexdigest()[:16]

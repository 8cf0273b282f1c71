"""The evaluating rank's side of one collective step (:mod:`actorsys._core.collective.protocol`): the
snapshot's handover, which tells the contributors where to write their shards and waits for them,
and the sink wrapper that notes each settled point for the other ranks.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from actorsys._core.collective.messages import PeerGoneError
from actorsys.outcome import Outcome
from actorsys.sinks import Sink

if TYPE_CHECKING:
    from actorsys._core.collective.protocol import Collective

__all__ = ["SettleNotes", "StoreHandover"]

log = logging.getLogger("actorsys")


class StoreHandover:
    """The evaluating rank's export of one step meeting the contributors (blocking calls,
    from the export thread); the snapshot's ``Handover``."""

    def __init__(self, collective: Collective, step: int) -> None:
        self.collective = collective
        self.step = step
        self._since: float | None = None

    def ready(self, directory: str, starts: dict[str, dict[str, int]]) -> None:
        self._since = time.monotonic()
        self.collective._store.set(
            f"ready/{self.step}", json.dumps({"directory": directory, "starts": starts})
        )

    def wait_contributions(self, check: Callable[[], None]) -> None:
        c = self.collective
        deadline = time.monotonic() + c.timeout
        for rank in range(c.world):
            if rank == c.rank:
                continue
            key = f"done/{self.step}/{rank}"
            what = f"rank {rank}'s shards of step {self.step}"
            answer = c._wait_for(key, what, check=check, deadline=deadline)
            c._store.delete_key(key)
            if answer != "ok":
                raise PeerGoneError(f"rank {rank} could not write its shards: {answer}")

    def abandon(self, error: str) -> None:
        if self._since is None:
            try:
                self.collective._store.set(f"ready/{self.step}", json.dumps(None))
            except Exception:
                log.warning("could not tell the other ranks that step %d failed", self.step)


class SettleNotes:
    """A sink, and every outcome it records noted as settled for the other ranks."""

    def __init__(self, sink: Sink, collective: Collective) -> None:
        self._sink = sink
        self._collective = collective

    def record(self, outcome: Outcome) -> None:
        try:
            self._sink.record(outcome)
        finally:
            self._collective.settled(outcome.step)

    def close(self) -> None:
        close = getattr(self._sink, "close", None)
        if callable(close):
            close()

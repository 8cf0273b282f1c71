"""The evaluating rank's side of one collective step (:mod:`actorsys._core.collective.protocol`): the
snapshot's handover, which tells the contributors where to write their shards and waits for them,
and the sink wrapper that notes each settled point for the other ranks.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from actorsys._core.collective.messages import _PeerGoneError
from actorsys._core.collective.store import JobStore, Keys
from actorsys.outcome import Outcome
from actorsys.sinks import Sink

__all__ = ["SettleNotes", "StoreHandover"]

log = logging.getLogger("actorsys")


class StoreHandover:
    """The evaluating rank's export of one step meeting the contributors (blocking calls,
    from the export thread); the snapshot's ``Handover``."""

    def __init__(self, store: JobStore, step: int, *, rank: int, world: int) -> None:
        self.store = store
        self.step = step
        self.rank = rank
        self.world = world
        self._since: float | None = None

    def ready(self, directory: str, starts: dict[str, dict[str, int]]) -> None:
        self._since = time.monotonic()
        self.store.set(Keys.ready(self.step), json.dumps({"directory": directory, "starts": starts}))

    def wait_contributions(self, check: Callable[[], None]) -> None:
        deadline = time.monotonic() + self.store.timeout
        for rank in range(self.world):
            if rank == self.rank:
                continue
            key = Keys.done(self.step, rank)
            what = f"rank {rank}'s shards of step {self.step}"
            answer = self.store.wait_for(key, what, check=check, deadline=deadline)
            self.store.delete(key)
            if answer != "ok":
                raise _PeerGoneError(f"rank {rank} could not write its shards: {answer}")

    def abandon(self, error: str) -> None:
        if self._since is None:
            try:
                self.store.set(Keys.ready(self.step), json.dumps(None))
            except Exception:
                log.warning("could not tell the other ranks that step %d failed", self.step)


class SettleNotes:
    """A sink, and every outcome it records noted as settled for the other ranks."""

    def __init__(self, sink: Sink, settled: Callable[[int], None]) -> None:
        self._sink = sink
        self._settled = settled

    def record(self, outcome: Outcome) -> None:
        try:
            self._sink.record(outcome)
        finally:
            self._settled(outcome.step)

    def close(self) -> None:
        close = getattr(self._sink, "close", None)
        if callable(close):
            close()

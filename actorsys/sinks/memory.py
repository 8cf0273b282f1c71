"""The ``Sink`` protocol, and ``MemorySink``, which keeps every outcome in memory."""

from __future__ import annotations

from typing import Protocol

from actorsys.outcome import Outcome


class Sink(Protocol):
    def record(self, outcome: Outcome) -> None: ...


class MemorySink:
    """Keeps every outcome in ``outcomes``, in settle order."""

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    def record(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)

    def by_step(self) -> dict[int, Outcome]:
        return {outcome.step: outcome for outcome in self.outcomes}

    def close(self) -> None:
        """Nothing to release; here so that every sink can be closed alike."""

"""Where outcomes go. A sink is any object with a sync, non-blocking ``record(outcome)``."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import IO, Protocol

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


class JsonlSink:
    """Appends one JSON object a line to ``path``, flushed per outcome.

    Values JSON cannot hold are written as their ``repr``. Call ``close()`` when done (the
    supervisor does not own the sink).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._file: IO[str] | None = None

    def record(self, outcome: Outcome) -> None:
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
        self._file.write(json.dumps(dataclasses.asdict(outcome), default=repr) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

"""Where outcomes go. A sink is any object with a sync, non-blocking ``record(outcome)``.

The supervisor calls ``record`` in the trio thread, as each point settles (and, for a point
refused at admission, before ``submit`` returns False): a sink must not do file or network I/O
there. The sinks here hand it to a thread of their own (``JsonlSink``) or keep it in memory.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import queue
import threading
import weakref
from typing import IO, Protocol

from actorsys._errors import UnsafePathError
from actorsys._files import open_private
from actorsys.outcome import Outcome

log = logging.getLogger("actorsys.sinks")


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
    """Appends one JSON object a line to ``path``, flushed per outcome, from a writer thread.

    ``record`` never blocks: it turns the outcome into its line (values JSON cannot hold are
    written as their ``repr``) and hands it to the sink's own writer thread, which opens the
    file at the first line, appends and flushes. A write that fails is logged by that thread
    and counted in ``errors``; the lines after it are still tried. ``flush()`` blocks until
    every line recorded so far is written; ``close()`` flushes and stops the thread (both block
    the calling thread: from trio, call them through ``trio.to_thread.run_sync``). The
    supervisor does not own the sink: whoever made it closes it; one still open when the
    interpreter exits is closed then (waiting at most ``EXIT_FLUSH_SECONDS``), so no recorded
    line is lost. Recording after ``close`` starts a new writer.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.errors = 0
        self._lines: queue.SimpleQueue[str | threading.Event | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._lock = threading.Lock()

    def record(self, outcome: Outcome) -> None:
        self._lines.put(json.dumps(dataclasses.asdict(outcome), default=repr) + "\n")
        self._ensure_writer()

    def flush(self, timeout: float | None = None) -> bool:
        """Block until the lines recorded so far are written (at most ``timeout`` seconds);
        True if they are."""
        if self._writer is None:
            return True
        written = threading.Event()
        self._lines.put(written)
        return written.wait(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Write what is recorded, close the file and stop the writer (waiting at most
        ``timeout`` seconds for it; it is a daemon thread, so a hung disk never holds up the
        interpreter's exit)."""
        with self._lock:
            writer, self._writer = self._writer, None
            if writer is None:
                return
            self._lines.put(None)
        writer.join(timeout)

    def _ensure_writer(self) -> None:
        with self._lock:
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_lines, name=f"actorsys jsonl sink {self.path}", daemon=True
                )
                self._writer.start()
                _OPEN_AT_EXIT.add(self)

    def _write_lines(self) -> None:
        file: IO[str] | None = None
        try:
            while (line := self._lines.get()) is not None:
                if isinstance(line, threading.Event):
                    line.set()
                    continue
                try:
                    if file is None:
                        fd = open_private(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                        file = os.fdopen(fd, "a", encoding="utf-8")
                    file.write(line)
                    file.flush()
                except (OSError, UnsafePathError):
                    self.errors += 1
                    log.exception("JsonlSink could not write to %s", self.path)
        finally:
            if file is not None:
                file.close()


EXIT_FLUSH_SECONDS = 10.0

_OPEN_AT_EXIT: weakref.WeakSet[JsonlSink] = weakref.WeakSet()


@atexit.register
def _close_open_sinks() -> None:
    for sink in list(_OPEN_AT_EXIT):
        sink.close(timeout=EXIT_FLUSH_SECONDS)

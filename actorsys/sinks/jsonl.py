"""``JsonlSink``: one JSON object a line, appended from a writer thread of its own."""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import queue
import threading
import weakref

from actorsys._errors import UnsafePathError
from actorsys._jsonl import append_lines, encode_line
from actorsys.outcome import Outcome

log = logging.getLogger("actorsys.sinks")


class JsonlSink:
    """Appends one JSON object a line to ``path`` as it comes, from a writer thread.

    ``record`` never blocks: it turns the outcome into its line (values JSON cannot hold are
    written as their ``repr``) and hands it to the sink's own writer thread, which appends the
    lines waiting at each turn in one write (:func:`actorsys._jsonl.append_lines`, not fsynced:
    a line survives a crash of this process; a torn last line of an earlier run is ended
    first). A write that fails is logged by that thread and counted in ``errors`` (one a
    line); the lines after it are still tried.
    ``flush()`` blocks until every line recorded so far is written; ``close()`` flushes and
    stops the thread (both block the calling thread: from trio, call them through
    ``actorsys.runtime.run_blocking``). The supervisor does not own the sink: whoever made it
    closes it; one still open when the interpreter exits is closed then (waiting at most
    ``EXIT_FLUSH_SECONDS``), so no recorded line is lost. Recording after ``close`` starts a new
    writer.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.errors = 0
        self._lines: queue.SimpleQueue[str | threading.Event | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._lock = threading.Lock()

    def record(self, outcome: Outcome) -> None:
        self._lines.put(encode_line(dataclasses.asdict(outcome)))
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
        stopping = False
        while not stopping:
            batch: list[str] = []
            written: list[threading.Event] = []
            item = self._lines.get()
            while True:
                if item is None:
                    stopping = True
                    break
                if isinstance(item, threading.Event):
                    written.append(item)
                else:
                    batch.append(item)
                try:
                    item = self._lines.get_nowait()
                except queue.Empty:
                    break
            self._append(batch)
            for event in written:
                event.set()

    def _append(self, batch: list[str]) -> None:
        try:
            append_lines(self.path, batch, fsync=False)
        except (OSError, UnsafePathError):
            self.errors += len(batch)
            log.exception("JsonlSink could not write to %s", self.path)


EXIT_FLUSH_SECONDS = 10.0

_OPEN_AT_EXIT: weakref.WeakSet[JsonlSink] = weakref.WeakSet()


@atexit.register
def _close_open_sinks() -> None:
    for sink in list(_OPEN_AT_EXIT):
        sink.close(timeout=EXIT_FLUSH_SECONDS)

"""A sequence of sinks as one: ``sink=[JsonlSink(path), TensorBoardSink(logdir)]``; and a
callback as a sink, for hosts that run a supervisor and must learn what settled.

Every outcome goes to every sink, in order. A sink that raises is logged and skipped for that
outcome; the others still get it, and the pipeline never sees the error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from actorsys._errors import ConfigError
from actorsys.outcome import Outcome
from actorsys.sinks.memory import MemorySink, Sink

log = logging.getLogger("actorsys.sinks")


class FanoutSink:
    """Records each outcome in every one of ``sinks``; ``close()`` closes those that can be."""

    def __init__(self, sinks: Iterable[Sink]) -> None:
        self.sinks: list[Sink] = [_checked(sink, f"sink[{i}]") for i, sink in enumerate(sinks)]

    def __repr__(self) -> str:
        return f"FanoutSink({self.sinks!r})"

    def record(self, outcome: Outcome) -> None:
        for sink in self.sinks:
            try:
                sink.record(outcome)
            except Exception:
                log.exception("sink %r failed to record step %d", sink, outcome.step)

    def close(self) -> None:
        for sink in self.sinks:
            close = getattr(sink, "close", None)
            if close is None:
                continue
            try:
                close()
            except Exception:
                log.exception("sink %r failed to close", sink)


class CallbackSink:
    """Calls ``on_record(outcome)`` for every outcome, in the trio thread as it settles (so,
    as every sink, ``on_record`` must not block): how the bridge and the watch service hear
    of each settled point. ``FanoutSink([host_sink, CallbackSink(fn)])`` records into the
    host's sink first."""

    def __init__(self, on_record: Callable[[Outcome], None]) -> None:
        self.on_record = on_record

    def __repr__(self) -> str:
        return f"CallbackSink({self.on_record!r})"

    def record(self, outcome: Outcome) -> None:
        self.on_record(outcome)

    def close(self) -> None:
        """Nothing to release: whoever gave the callback owns what it writes."""


def as_sink(sink: Sink | Sequence[Sink] | None) -> Sink:
    """The one sink the pipeline records into: ``sink`` itself, a :class:`FanoutSink` over a
    sequence of sinks, or a new :class:`~actorsys.MemorySink` for None. Raises
    :class:`~actorsys.ConfigError` (field ``sink``) for anything without ``record(outcome)``."""
    if sink is None:
        return MemorySink()
    if callable(getattr(sink, "record", None)):
        return sink  # type: ignore[return-value]  # a Sink that is also a Sequence
    if isinstance(sink, Sequence) and not isinstance(sink, str | bytes):
        return FanoutSink(sink)
    raise ConfigError("sink", f"{sink!r} has no record(outcome) method; pass a sink or a list of sinks")


def _checked(sink: Any, field: str) -> Sink:
    if not callable(getattr(sink, "record", None)):
        raise ConfigError("sink", f"{field} = {sink!r} has no record(outcome) method")
    return sink

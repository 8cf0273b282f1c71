"""Where :class:`~actorsys.sinks.fanout.CallbackSink`, ``FanoutSink`` and ``as_sink`` were
first imported from; they live in :mod:`actorsys.sinks.fanout`."""

from __future__ import annotations

from actorsys.sinks.fanout import CallbackSink, FanoutSink, as_sink

__all__ = ["CallbackSink", "FanoutSink", "as_sink"]

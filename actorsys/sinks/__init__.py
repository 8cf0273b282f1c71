"""Where outcomes go. A sink is any object with a sync, non-blocking ``record(outcome)``.

The supervisor calls ``record`` in the trio thread, as each point settles (and, for a point
refused at admission, before ``submit`` returns False): a sink must not do file or network I/O
there. The sinks here hand it to a thread of their own (``JsonlSink``, and the TensorBoard and
W&B writers) or keep it in memory.

The package's modules, one concept each:

- :mod:`~actorsys.sinks.memory`: the ``Sink`` protocol and ``MemorySink``;
- :mod:`~actorsys.sinks.jsonl`: ``JsonlSink``, one JSON object a line;
- :mod:`~actorsys.sinks.fanout`: ``FanoutSink`` (a sequence of sinks as one), ``CallbackSink``
  and ``as_sink``;
- :mod:`~actorsys.sinks.rows`: how a point becomes a logged row, the one place that names
  ``eval/step``, encodes a skipped point and defines W&B's metrics against ``eval/step``;
- :mod:`~actorsys.sinks.tensorboard` and :mod:`~actorsys.sinks.wandb`: ``TensorBoardSink`` and
  ``WandbSink`` (their libraries are imported when a sink is made, not with actorsys).
"""

from __future__ import annotations

from actorsys.sinks.jsonl import EXIT_FLUSH_SECONDS, JsonlSink
from actorsys.sinks.memory import MemorySink, Sink

__all__ = ["EXIT_FLUSH_SECONDS", "JsonlSink", "MemorySink", "Sink"]

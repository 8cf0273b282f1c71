"""What the sync and the asyncio bridge share: their :class:`~bridge._runtime.Runtime` and
the calls that never wait (the config, the sink, ``note_step``, ``statistics``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actorsys.config import EvalConfig
from actorsys.outcome import SupervisorStatistics
from actorsys.sinks import Sink
from bridge._runtime import Runtime

DEFAULT_HANDOFF_TIMEOUT = 1.0


class BridgeBase:
    """What the sync and the asyncio bridge share: the runtime and the calls that never wait."""

    def __init__(
        self,
        config: EvalConfig,
        *,
        eval_fn: Any,
        fleet: Any = None,
        sink: Sink | Sequence[Sink] | None = None,
        handoff_timeout: float = DEFAULT_HANDOFF_TIMEOUT,
    ) -> None:
        self._rt = Runtime(
            config, eval_fn=eval_fn, fleet=fleet, sink=sink, handoff_timeout=handoff_timeout
        )

    @property
    def config(self) -> EvalConfig:
        return self._rt.config

    @property
    def sink(self) -> Sink:
        """Where outcomes are recorded: the sink given, or a :class:`~actorsys.MemorySink`."""
        return self._rt.sink

    def note_step(self, step: int) -> None:
        """Tell the supervisor the trainer's current step (for ``eval/lag_steps``). Never blocks."""
        self._rt.note_step(step)

    def statistics(self) -> SupervisorStatistics:
        """In flight, settled, skipped by reason, restarts, as last published. Never blocks."""
        return self._rt.statistics()

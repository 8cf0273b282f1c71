"""What the sync and the asyncio bridge share: their :class:`~bridge._runtime.Runtime` and
the calls that never wait (the config, the sink, ``note_step``, ``statistics``, and what the
supervisor decided: ``best``, ``protected_steps``, ``should_stop``, ``due``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actorsys.config import EvalConfig
from actorsys.outcome import BestPoint, SupervisorStatistics
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

    def best(self) -> list[BestPoint]:
        """As :meth:`actorsys.EvalSupervisor.best`, as last published. Never blocks."""
        return self._rt.trio.decided()[0]

    def protected_steps(self) -> frozenset[int]:
        """As :meth:`actorsys.EvalSupervisor.protected_steps`: a checkpoint handed over by a
        ``submit`` that returned is in it at once, until the sink saw its point settle.
        Never blocks."""
        return self._rt.trio.decided()[1]

    @property
    def should_stop(self) -> bool:
        """As :attr:`actorsys.EvalSupervisor.should_stop`, true by the time the sink got the
        outcome that made it so. Never blocks."""
        return self.stop_reason is not None

    @property
    def stop_reason(self) -> str | None:
        """Why :attr:`should_stop` turned True, or None. Never blocks."""
        return self._rt.trio.decided()[2]

    def due(self, step: int) -> bool:
        """:meth:`actorsys.EvalConfig.due` of the bridge's config. Never blocks."""
        return self._rt.config.due(step)

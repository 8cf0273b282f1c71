"""What both trainer callbacks share: an :class:`~bridge.EvalBridge` opened for one
``train()``, a point every ``every`` optimizer steps (by default ``config.eval_interval``),
the outcomes settled since the last look (each turned into its log row by
:func:`actorsys.sinks.rows.log_row`), and the stop signal (``config.stop_when``,
``config.patience``), logged once.

The bridge runs the supervisor in its own thread; the sink below is called there, so it
only appends to a deque (atomic in CPython) that the trainer's thread empties.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Sequence
from typing import Any

import torch

from actorsys._errors import ConfigError, SupervisorClosedError, SupervisorGaveUpError
from actorsys.config import EvalConfig, require_seconds
from actorsys.outcome import CloseReport, DrainReport, Outcome
from actorsys.sinks import Sink
from bridge import EvalBridge

log = logging.getLogger("actorsys.integrations")


class SettledPoints:
    """A sink that keeps what settled until the trainer's thread takes it."""

    def __init__(self) -> None:
        self._outcomes: collections.deque[Outcome] = collections.deque()

    def record(self, outcome: Outcome) -> None:
        self._outcomes.append(outcome)

    def take(self) -> list[Outcome]:
        """The outcomes settled since the last call, in the order they settled."""
        taken = []
        while self._outcomes:
            taken.append(self._outcomes.popleft())
        return taken


class TrainingSession:
    """One bridge for one ``train()``: opened with :meth:`open`, a point per :meth:`step`
    that is due, and :meth:`finish` at the end (drain, then close).

    Every method runs on the trainer's thread and blocks it only as the bridge does: ``open``
    on the bridge's start and the preparation of the buffer sets, ``step`` on one copy of the
    weights (and on a free slot under ``overflow="backpressure"``), ``finish`` for at most
    ``drain_timeout`` plus ``config.close_timeout`` seconds.
    """

    def __init__(
        self,
        config: EvalConfig,
        *,
        eval_fn: Any,
        fleet: Any,
        every: int | None,
        sink: Sink | Sequence[Sink] | None,
        drain_timeout: float,
    ) -> None:
        if not isinstance(config, EvalConfig):
            raise ConfigError("config", f"expected an EvalConfig, got {type(config).__name__}")
        if every is None:
            every = config.eval_interval
            if every is None:
                raise ConfigError("every", "pass every= (optimizer steps between points) or set "
                                           "EvalConfig.eval_interval (--eval-interval)")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError("every", f"expected an integer >= 1 (optimizer steps), got {every!r}")
        self.config = config
        self.every = every
        self.drain_timeout = require_seconds("drain_timeout", drain_timeout, allow_zero=True)
        self._eval_fn = eval_fn
        self._fleet = fleet
        self._user_sinks: list[Sink] = (
            [] if sink is None else list(sink) if isinstance(sink, Sequence) else [sink]
        )
        self.settled = SettledPoints()
        self._bridge: EvalBridge | None = None
        self._last_step: int | None = None
        self._stopped = False
        self._told_stop = False
        self.drain_report: DrainReport | None = None
        self.close_report: CloseReport | None = None

    @property
    def is_open(self) -> bool:
        return self._bridge is not None

    def open(self, model: torch.nn.Module) -> None:
        """Start the bridge and prepare its buffer sets for ``model`` (so the first point
        costs a copy into mapped memory). A session still open from an earlier ``train()``
        that ended in an exception is closed first, without draining."""
        if self._bridge is not None:
            self._bridge.close(drain=False)
        self._stopped = self._told_stop = False
        self._last_step = None
        self.drain_report = self.close_report = None
        bridge = EvalBridge(
            self.config, eval_fn=self._eval_fn, fleet=self._fleet,
            sink=[*self._user_sinks, self.settled],
        )
        bridge.__enter__()
        self._bridge = bridge
        bridge.prepare(model=model)

    def step(self, step: int, model: torch.nn.Module) -> None:
        """Note the trainer's step; submit ``model`` if ``step`` is a multiple of ``every``
        (once: a step seen again, as under gradient accumulation, is ignored).

        On every process of a distributed job alike (a sharded model's submit is a
        collective). A supervisor that gave up or closed is logged once; training goes on
        without further points.
        """
        bridge = self._bridge
        if bridge is None or self._stopped or step == self._last_step:
            return
        self._last_step = step
        bridge.note_step(step)
        if step % self.every:
            return
        try:
            bridge.submit(step, model=model)
        except (SupervisorGaveUpError, SupervisorClosedError) as exc:
            self._stopped = True
            log.error("evaluation stopped at step %d, training goes on without it: %r", step, exc)

    def should_stop(self) -> bool:
        """True once the supervisor's stop signal holds (:attr:`bridge.EvalBridge.should_stop`);
        the first time, its reason is logged. Never blocks."""
        bridge = self._bridge
        if bridge is None or not bridge.should_stop:
            return False
        if not self._told_stop:
            self._told_stop = True
            log.warning("evaluation asks training to stop: %s", bridge.stop_reason)
        return True

    def finish(self) -> None:
        """Drain for at most ``drain_timeout`` seconds, then close within the config's
        ``close_timeout``; what settled meanwhile is in :attr:`settled`."""
        bridge, self._bridge = self._bridge, None
        if bridge is None:
            return
        try:
            self.drain_report = bridge.drain(timeout=self.drain_timeout)
        finally:
            self.close_report = bridge.close()
        if self.close_report.abandoned:
            log.warning("eval points cut off at the end of training: %s", self.close_report.abandoned)

    def abort(self) -> None:
        """Close at once, cutting off what is in flight (training failed)."""
        bridge, self._bridge = self._bridge, None
        if bridge is not None:
            self.close_report = bridge.close(drain=False)

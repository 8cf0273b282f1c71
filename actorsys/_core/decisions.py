"""What the supervisor has decided from the numbers so far, read without waiting: the best
points, the steps a trainer's rotation must keep, whether to stop, and the cadence
(:mod:`actorsys.actors.best` decides; these read its state)."""

from __future__ import annotations

from actorsys._core.wiring import Wiring
from actorsys.actors.point import State
from actorsys.config import EvalConfig
from actorsys.outcome import BestPoint


class Decisions:
    """The deciding half of :class:`~actorsys.EvalSupervisor`'s surface. Never blocks."""

    config: EvalConfig
    _wiring: Wiring | None


    def best(self) -> list[BestPoint]:
        """The best ok points by ``config.best_metric``, best first (at most ``keep_best``,
        or the one best with ``keep_best=0``); empty without ``best_metric``. Never blocks."""
        return [] if self._wiring is None else list(self._wiring.retirer.best.points)

    def protected_steps(self) -> frozenset[int]:
        """The steps whose checkpoints a trainer's own rotation must not delete yet: those
        submitted in reuse mode or as ``checkpoint_dir`` that have not settled, and those kept
        as best (``keep_best``). Never blocks."""
        if self._wiring is None:
            return frozenset()
        borrowed = {
            t.step for t in self._wiring.flight if t.state is not State.SETTLED and t.point.borrowed
        }
        return frozenset(borrowed) | self._wiring.retirer.best.protected

    @property
    def should_stop(self) -> bool:
        """True once ``config.stop_when`` or ``config.patience`` holds; stays True. Why:
        :attr:`stop_reason`."""
        return self.stop_reason is not None

    @property
    def stop_reason(self) -> str | None:
        """Why :attr:`should_stop` turned True (the step and the metric), or None."""
        return None if self._wiring is None else self._wiring.retirer.best.stop_reason

    def due(self, step: int) -> bool:
        """Whether ``step`` is an evaluation step by ``config.eval_interval`` and
        ``config.skip_eval_before_train`` (:meth:`actorsys.EvalConfig.due`)."""
        return self.config.due(step)

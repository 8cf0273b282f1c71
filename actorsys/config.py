"""EvalConfig: everything the supervisor needs to know, validated when it is built.

Example::

    config = EvalConfig(hf_dir="/dev/shm/eval", max_in_flight=2, overflow="latest",
                        eval_timeout=900)
    # reuse the HF checkpoints the trainer saves anyway, no export:
    config = EvalConfig(save_hf="/ckpt/hf/{step}")
    # from a trainer's command line (--eval-hf-dir, --eval-max-in-flight, ...):
    EvalConfig.add_arguments(parser)
    config = EvalConfig.from_args(parser.parse_args())

A bad value raises :class:`actorsys.ConfigError` (a ``ValueError``) naming the field and what
it accepts.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from actorsys import _flags
from actorsys._errors import ConfigError
from actorsys._flags import require_int, require_seconds
from actorsys.flag_groups import add_registered_flags

__all__ = [
    "BEST_MODES",
    "OVERFLOW_POLICIES",
    "SHARED_UPDATE_POLICIES",
    "BestMode",
    "EvalConfig",
    "Overflow",
    "SharedUpdate",
    "require_seconds",
]

Overflow = Literal["backpressure", "skip", "latest"]
OVERFLOW_POLICIES: tuple[Overflow, ...] = ("backpressure", "skip", "latest")
BestMode = Literal["max", "min"]
BEST_MODES: tuple[BestMode, ...] = ("max", "min")
SharedUpdate = Literal["wait", "preempt"]
SHARED_UPDATE_POLICIES: tuple[SharedUpdate, ...] = ("wait", "preempt")


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """How evaluation points are staged, admitted, bounded and supervised.

    - ``hf_dir``: staging directory for fresh exports, one ``step_<N>`` per point.
    - ``save_hf``: pattern of checkpoints the trainer saves anyway, e.g. ``"/ckpt/hf/{step}"``
      (reuse mode: ``submit(step)`` with no source evaluates that checkpoint, no export).
    - ``base_checkpoint``: HF dir whose non-weight files (config, tokenizer, generation config)
      are copied into every export.
    - ``max_in_flight``: points admitted and not yet settled, and so weight copies alive.
    - ``overflow``: what ``submit`` does when ``max_in_flight`` points are in flight:
      ``"backpressure"`` waits for a slot, ``"skip"`` settles the new point ``busy`` before any
      export, ``"latest"`` supersedes queued points that are not yet pinned.
    - ``keep_snapshots``: how many of our own evaluated exports stay on disk (a ring).
    - ``export_timeout`` / ``pin_timeout`` / ``eval_timeout``: per-stage deadlines in seconds
      (``None``: unbounded). ``pin_retries``: re-loads after a version mismatch.
    - ``close_timeout``: default budget of ``drain``-then-cancel at close.
    - ``max_restarts`` within ``restart_period`` seconds: actor crashes tolerated before the
      supervisor gives up.
    - ``max_shard_size``: bytes per safetensors shard of an export.
    - ``probe``: after the version reads back, every engine answers a short fixed probe that
      must agree with what the snapshot computes (see :mod:`actorsys.fleet.pin.probe`); an engine
      serving other weights is ``pin_violation``. Where no probe can be had (an engine with no
      completion endpoint, a snapshot without a config) the pin checks the version only.
    - ``eval_rank``: in a ``torch.distributed`` job of several ranks, the rank whose supervisor
      pins, evaluates and records; every rank opens one with the same config and submits the
      same steps (collective), the others only hand over their weight shards.
    - ``collective_timeout``: seconds one rank waits for another (at open, for an admission
      decision, for shards) before it gives up: an error at open, a skipped point later.

    Deciding from the number (:mod:`actorsys.actors.best`):

    - ``best_metric`` (e.g. ``"eval/gsm8k"``), better when higher (``best_mode="max"``) or
      lower (``"min"``): the snapshots of the ``keep_best`` best ok points are kept beside the
      ring of ``keep_snapshots`` and left on close, listed best first in ``hf_dir/best.json``;
      a trainer's own checkpoint (reuse mode, ``checkpoint_dir``) is named, never deleted.
    - ``stop_when``: metric -> threshold (``{"eval/gsm8k": 0.8}``); ``should_stop`` turns True
      at the first ok point that reaches every threshold of the mapping (``>=`` for ``"max"``,
      ``<=`` for ``"min"``). ``patience``: ``should_stop`` turns True after that many ok points
      in a row that do not improve ``best_metric`` (points without it do not count).
    - ``eval_interval`` and ``skip_eval_before_train``, miles' cadence: see :meth:`due`.

    Shared mode (:meth:`actorsys.EvalSupervisor.weight_update`):

    - ``shared_update``: what the trainer's update of a shared fleet's weights does to the
      ``served`` points admitted before it: ``"wait"`` for them to settle, for at most
      ``shared_update_timeout`` seconds, then cut what is left; ``"preempt"`` cut them at
      once (``preempted`` if evaluating, ``superseded`` if not).

    Resuming:

    - ``resume``: a supervisor that opens the ``hf_dir`` of a run that crashed evaluates again
      the points that run admitted and never settled whose snapshots are complete, at their
      own steps, before new points; in reuse mode from the trainer's checkpoints
      (:mod:`actorsys._core.resume`). Either way the supervisor keeps a journal of its points
      (:mod:`actorsys._core.journal`), and without ``resume`` what a crashed run left unsettled
      is retired. Needs ``hf_dir`` or ``save_hf``, where the journal is kept.
    """

    hf_dir: str | os.PathLike[str] | None = None
    save_hf: str | None = None
    base_checkpoint: str | os.PathLike[str] | None = None
    max_in_flight: int = 2
    overflow: Overflow = "backpressure"
    keep_snapshots: int = 2
    export_timeout: float | None = None
    pin_timeout: float = 600.0
    pin_retries: int = 2
    eval_timeout: float | None = None
    close_timeout: float = 30.0
    max_restarts: int = 3
    restart_period: float = 60.0
    max_shard_size: int = 5 * 1000**3
    probe: bool = True
    eval_rank: int = 0
    collective_timeout: float = 300.0
    best_metric: str | None = None
    best_mode: BestMode = "max"
    keep_best: int = 0
    stop_when: Mapping[str, float] | None = None
    patience: int | None = None
    eval_interval: int | None = None
    skip_eval_before_train: bool = False
    shared_update: SharedUpdate = "wait"
    shared_update_timeout: float = 60.0
    resume: bool = False

    def __post_init__(self) -> None:
        for name in ("hf_dir", "base_checkpoint"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str | os.PathLike):
                raise ConfigError(name, f"expected a path (str or os.PathLike) or None, got {value!r}")
        if self.save_hf is not None and (
            not isinstance(self.save_hf, str) or "{step}" not in self.save_hf
        ):
            raise ConfigError(
                "save_hf", f"expected a path pattern containing '{{step}}', got {self.save_hf!r}"
            )
        if self.overflow not in OVERFLOW_POLICIES:
            raise ConfigError(
                "overflow", f"expected one of {', '.join(OVERFLOW_POLICIES)}, got {self.overflow!r}"
            )
        if not isinstance(self.probe, bool):
            raise ConfigError("probe", f"expected True or False, got {self.probe!r}")
        require_int("max_in_flight", self.max_in_flight, minimum=1)
        require_int("keep_snapshots", self.keep_snapshots, minimum=0)
        require_int("pin_retries", self.pin_retries, minimum=0)
        require_int("max_restarts", self.max_restarts, minimum=0)
        require_int("max_shard_size", self.max_shard_size, minimum=1)
        require_int("eval_rank", self.eval_rank, minimum=0)
        for name in ("export_timeout", "eval_timeout"):
            require_seconds(name, getattr(self, name), optional=True)
        for name in ("pin_timeout", "close_timeout", "restart_period", "collective_timeout"):
            require_seconds(name, getattr(self, name))
        self._check_deciding()
        if self.shared_update not in SHARED_UPDATE_POLICIES:
            raise ConfigError(
                "shared_update", f"expected 'wait' or 'preempt', got {self.shared_update!r}"
            )
        require_seconds("shared_update_timeout", self.shared_update_timeout, allow_zero=True)

    def _check_deciding(self) -> None:
        """The fields of best-keeping, stopping and cadence."""
        if self.best_metric is not None:
            _require_metric("best_metric", self.best_metric)
        if self.best_mode not in BEST_MODES:
            raise ConfigError("best_mode", f"expected 'max' or 'min', got {self.best_mode!r}")
        require_int("keep_best", self.keep_best, minimum=0)
        if self.patience is not None:
            require_int("patience", self.patience, minimum=1)
        for name, wanted in (("keep_best", self.keep_best > 0), ("patience", self.patience)):
            if wanted and self.best_metric is None:
                raise ConfigError(
                    "best_metric", f"{name} needs best_metric, the metric that ranks the points "
                                   "(e.g. best_metric='eval/gsm8k')"
                )
        if self.stop_when is not None:
            # A copy: the config stays what it was when checked.
            object.__setattr__(self, "stop_when", _thresholds(self.stop_when))
        if self.eval_interval is not None:
            require_int("eval_interval", self.eval_interval, minimum=1)
        if not isinstance(self.skip_eval_before_train, bool):
            raise ConfigError(
                "skip_eval_before_train", f"expected True or False, got {self.skip_eval_before_train!r}"
            )
        if not isinstance(self.resume, bool):
            raise ConfigError("resume", f"expected True or False, got {self.resume!r}")
        if self.resume and self.hf_dir is None and self.save_hf is None:
            raise ConfigError("resume", "needs hf_dir (or save_hf in reuse mode), where the "
                                        "journal of the points it resumes is kept")

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
        """Add the evaluation flags to a trainer's ``parser`` (one argument group, returned):
        ``--eval-hf-dir``, ``--save-hf``, ``--eval-max-in-flight``, ``--eval-overflow-policy``,
        ``--eval-keep-snapshots`` as miles names them, and ``--eval-timeout``,
        ``--eval-pin-timeout``, ``--eval-close-timeout``, ``--eval-probe on|off``; and miles' eval-data flags
        (``--eval-prompt-data``, ``--eval-config``, ``--n-samples-per-eval-prompt``, ...; read
        them back with :func:`actorsys.evals.datasets_from_args`); and the eval fleet's
        ``--eval-num-gpus``, ``--eval-num-gpus-per-engine``, ``--eval-engine`` (read by
        :meth:`actorsys.fleet.ray.RayFleet.from_args`). Flags the parser already defines are
        left to it. A bad value is an argparse error naming the flag.

        The eval-data flags belong to :mod:`actorsys.evals` and the fleet's to
        :mod:`actorsys.fleet`, which register them (:mod:`actorsys.flag_groups`): the config
        imports no feature."""
        group = _flags.add_arguments(parser, cls)
        add_registered_flags(group)
        return group

    @classmethod
    def from_args(cls, namespace: argparse.Namespace, **overrides: Any) -> EvalConfig:
        """The config the flags in ``namespace`` describe; unset flags keep their defaults and
        ``overrides`` (any field, e.g. ``base_checkpoint``) win. A ``--save-hf`` pattern may
        use miles' ``{rollout_id}``. Raises :class:`ConfigError`, noting the flag."""
        kwargs = {**_flags.config_kwargs(namespace), **overrides}
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            flag = _flags.flag_of(exc.field)
            if flag is not None and exc.field not in overrides and exc.field in kwargs:
                exc.add_note(f"set by {flag}")
            raise

    @property
    def staging_dir(self) -> str | None:
        """``hf_dir`` as a plain string, or None."""
        return None if self.hf_dir is None else os.fspath(self.hf_dir)

    def due(self, step: int) -> bool:
        """Whether ``step`` is an evaluation step, as miles decides it: a multiple of
        ``eval_interval`` (step 0 is one), except step 0 under ``skip_eval_before_train``.
        With no ``eval_interval`` every step is due (the caller keeps its own cadence) but
        step 0 under ``skip_eval_before_train``."""
        if step == 0 and self.skip_eval_before_train:
            return False
        return self.eval_interval is None or step % self.eval_interval == 0

    def reuse_path(self, step: int) -> str | None:
        """Where the trainer saved the checkpoint of ``step`` (reuse mode), or None."""
        return None if self.save_hf is None else self.save_hf.format(step=step)


def _require_metric(name: str, metric: object) -> str:
    if not isinstance(metric, str) or not metric.strip():
        raise ConfigError(name, f"expected a metric name as the outcomes carry it, such as "
                                f"'eval/gsm8k', got {metric!r}")
    return metric


def _thresholds(stop_when: object) -> dict[str, float]:
    if not isinstance(stop_when, Mapping) or not stop_when:
        raise ConfigError("stop_when", "expected a non-empty mapping of metric to threshold, "
                                       f"e.g. {{'eval/gsm8k': 0.8}}, got {stop_when!r}")
    thresholds = {}
    for metric, threshold in stop_when.items():
        _require_metric("stop_when", metric)
        if (isinstance(threshold, bool) or not isinstance(threshold, int | float)
                or not math.isfinite(threshold)):
            raise ConfigError("stop_when", f"the threshold of {metric!r} must be a finite "
                                           f"number, got {threshold!r}")
        thresholds[metric] = float(threshold)
    return thresholds

"""The flags of a dedicated eval fleet, as miles names them: ``--eval-num-gpus N`` and
``--eval-num-gpus-per-engine G`` (default 1), and ours, ``--eval-engine embedded|vllm``.

:meth:`RayFleet.from_args <actorsys.fleet.ray.RayFleet.from_args>` reads them back through
:func:`fleet_flags_from_args`: ``N // G`` engines of ``G`` GPUs each, or, with
``--eval-num-gpus 0`` (or unset), one CPU engine. A flag the trainer's parser already
defines (miles defines the first two) is left to it and read back under its usual name.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from actorsys._errors import ConfigError
from actorsys._flags import Flag, add_flags, int_at_least, require_int
from actorsys.flag_groups import register_flags

ENGINE_KINDS = ("embedded", "vllm")
CPU_ENGINE: Mapping[str, Any] = {"num_cpus": 1}

FLEET_FLAGS = (
    Flag("--eval-num-gpus", "num_gpus", int_at_least(0), "N",
         "GPUs of the dedicated eval fleet (RayFleet.from_args); 0: one CPU engine"),
    Flag("--eval-num-gpus-per-engine", "num_gpus_per_engine", int_at_least(1), "G",
         "GPUs of each eval engine (default 1; vLLM engines shard over them)"),
    Flag("--eval-engine", "engine", str, None, "the engine the eval fleet runs (default embedded)",
         choices=ENGINE_KINDS),
)


@dataclass(frozen=True)
class FleetFlags:
    """What the fleet flags say: ``num_gpus`` in all (0: none), ``num_gpus_per_engine``,
    and the ``engine`` kind. Checked at construction (:class:`ConfigError` naming the flag)."""

    num_gpus: int = 0
    num_gpus_per_engine: int = 1
    engine: str = "embedded"

    def __post_init__(self) -> None:
        require_int("--eval-num-gpus", self.num_gpus, minimum=0)
        require_int("--eval-num-gpus-per-engine", self.num_gpus_per_engine, minimum=1)
        if self.engine not in ENGINE_KINDS:
            raise ConfigError("--eval-engine", f"expected one of {ENGINE_KINDS}, got {self.engine!r}")
        if self.num_gpus and self.num_gpus % self.num_gpus_per_engine:
            raise ConfigError(
                "--eval-num-gpus",
                f"{self.num_gpus} GPUs do not split into engines of {self.num_gpus_per_engine}; "
                "give a multiple of --eval-num-gpus-per-engine",
            )

    @property
    def num_engines(self) -> int:
        return self.num_gpus // self.num_gpus_per_engine if self.num_gpus else 1

    @property
    def resources(self) -> dict[str, Any]:
        """Each engine actor's Ray resources: ``G`` GPUs, or one CPU without GPUs."""
        return {"num_gpus": self.num_gpus_per_engine} if self.num_gpus else dict(CPU_ENGINE)


@register_flags
def add_fleet_arguments(group: argparse._ArgumentGroup) -> None:
    """Add the fleet flags to ``group`` (skipping flags its parser already defines). A bad
    value is an argparse error naming the flag."""
    add_flags(group, FLEET_FLAGS)


def fleet_flags_from_args(namespace: argparse.Namespace) -> FleetFlags:
    """The fleet flags set in ``namespace``; unset ones keep their defaults."""
    values = {flag.field: getattr(namespace, flag.dest, None) for flag in FLEET_FLAGS}
    return FleetFlags(**{k: v for k, v in values.items() if v is not None})

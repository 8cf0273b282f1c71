"""The trainer flags of :class:`~actorsys.EvalConfig`, named as miles launch scripts name them.

``--eval-hf-dir``, ``--save-hf``, ``--eval-max-in-flight``, ``--eval-overflow-policy`` and
``--eval-keep-snapshots`` are miles' own flags; ``--eval-timeout``, ``--eval-pin-timeout``,
``--eval-close-timeout`` and ``--eval-probe on|off`` are ours. A flag the trainer's parser
already defines (miles defines ``--save-hf``) is left to it and read back from the namespace
under its usual name, and miles' ``{rollout_id}`` in a ``--save-hf`` pattern reads as
``{step}``.

Values are checked by building the config itself, so a bad one is reported by argparse under
its flag with EvalConfig's own message.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from actorsys._errors import ConfigError

ROLLOUT_ID = "{rollout_id}"
EXIT_USAGE = 2
"""The exit status of a command given a bad argument (argparse's own)."""


@dataclass(frozen=True)
class Flag:
    option: str
    field: str
    parse: Callable[[str], Any]
    metavar: str
    help: str
    choices: tuple[str, ...] | None = None
    miles_fallback: str | None = None
    """The trainer's own miles flag (its ``dest``) whose value stands in when this one is unset."""

    @property
    def dest(self) -> str:
        return self.option.removeprefix("--").replace("-", "_")


def on_off(text: str) -> bool:
    """``on`` / ``off`` (also ``true`` / ``false``, ``1`` / ``0``) as a bool."""
    value = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}.get(
        text.strip().lower()
    )
    if value is None:
        raise ValueError(text)
    return value


def save_hf_pattern(text: str) -> str:
    """A ``--save-hf`` pattern with miles' ``{rollout_id}`` spelled ``{step}``."""
    return text.replace(ROLLOUT_ID, "{step}")


FLAGS = (
    Flag("--eval-hf-dir", "hf_dir", str, "DIR",
         "staging dir for one HF snapshot per eval point (tmpfs recommended); unset with "
         "--save-hf set: evaluate the trainer's own --save-hf checkpoints"),
    Flag("--save-hf", "save_hf", save_hf_pattern, "PATTERN",
         "pattern of the HF checkpoints the trainer saves, with {step} or {rollout_id}"),
    Flag("--eval-max-in-flight", "max_in_flight", int, "N",
         "eval points admitted and not yet settled (and so weight copies alive)"),
    Flag("--eval-overflow-policy", "overflow", str, "POLICY",
         "at the in-flight cap: backpressure (wait for a slot), skip (the new point, as "
         "busy) or latest (supersede queued points)",
         choices=("backpressure", "skip", "latest")),
    Flag("--eval-keep-snapshots", "keep_snapshots", int, "N",
         "evaluated snapshots kept under --eval-hf-dir (a ring); --save-hf output is never "
         "deleted"),
    Flag("--eval-timeout", "eval_timeout", float, "SECONDS",
         "seconds one evaluation may take before it is skipped (timeout)"),
    Flag("--eval-pin-timeout", "pin_timeout", float, "SECONDS",
         "seconds pinning the fleet to a snapshot may take before the point is skipped"),
    Flag("--eval-close-timeout", "close_timeout", float, "SECONDS",
         "seconds drain-then-cancel may take when the trainer closes evaluation"),
    Flag("--eval-probe", "probe", on_off, "on|off",
         "after a pin, check that every engine computes what the snapshot computes, not only "
         "that it reports its version"),
    Flag("--eval-rank", "eval_rank", int, "RANK",
         "in a torch.distributed job, the rank that pins, evaluates and records (the others "
         "hand over their weight shards)"),
)


def add_arguments(
    parser: argparse.ArgumentParser, config_cls: type[Any]
) -> argparse._ArgumentGroup:
    """Add the flags of ``config_cls`` to ``parser`` as one group; return the group."""
    defaults = {f.name: f.default for f in dataclasses.fields(config_cls)}
    group = parser.add_argument_group(
        "evaluation", "non-blocking evaluation of weight snapshots (actorsys)"
    )
    for flag in FLAGS:
        default = defaults[flag.field]
        try:
            group.add_argument(
                flag.option,
                dest=flag.dest,
                type=_checked(flag, config_cls),
                choices=flag.choices,
                default=None,
                metavar=flag.metavar,
                help=f"{flag.help} (default: {'unset' if default is None else default})",
            )
        except argparse.ArgumentError:
            continue  # the trainer defines this flag itself; from_args reads its value
    return group


def config_kwargs(namespace: argparse.Namespace) -> dict[str, Any]:
    """The EvalConfig arguments set in ``namespace`` (flags left unset are left out)."""
    kwargs: dict[str, Any] = {}
    for flag in FLAGS:
        value = getattr(namespace, flag.dest, None)
        if value is None:
            continue
        kwargs[flag.field] = save_hf_pattern(value) if flag.field == "save_hf" else value
    return kwargs


def flag_of(field: str) -> str | None:
    return next((flag.option for flag in FLAGS if flag.field == field), None)


def _checked(flag: Flag, config_cls: type[Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = flag.parse(text)
        except ValueError as exc:
            kind = {int: "an integer", float: "a number", on_off: "on or off"}.get(
                flag.parse, "valid"
            )
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from exc
        try:
            config_cls(**{flag.field: value})
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc
        return value

    return parse


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer of at least ``minimum``, else a one-line error."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse

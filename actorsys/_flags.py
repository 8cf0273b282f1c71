"""The trainer flags of :class:`~actorsys.EvalConfig`, named as miles launch scripts name them.

``--eval-hf-dir``, ``--save-hf``, ``--eval-max-in-flight``, ``--eval-overflow-policy``,
``--eval-keep-snapshots``, ``--eval-interval`` and ``--skip-eval-before-train`` are miles' own
flags; ``--eval-timeout``, ``--eval-pin-timeout``, ``--eval-close-timeout``, ``--eval-probe
on|off``, ``--eval-best-metric``, ``--eval-best-mode``, ``--eval-keep-best``,
``--eval-shared-update``, ``--eval-shared-update-timeout`` and ``--eval-resume`` are ours. A flag
the trainer's parser already defines (miles defines ``--save-hf``) is left to it and read back
from the namespace under its usual name, and miles' ``{rollout_id}`` in a ``--save-hf``
pattern reads as ``{step}``.

Values are checked by building the config itself, so a bad one is reported by argparse under
its flag with EvalConfig's own message.

This module is also the one home of what every flag of actorsys shares: :func:`add_flag` (a
flag the trainer's parser already defines is left to it), :func:`add_flags` and
:func:`checked` (a :class:`Flag`'s argparse ``type``: parsed, then checked by the feature that
owns it, a bad value one line under its flag), and the rules for integers and seconds that the
config, the features and the commands check against (:func:`require_int`,
:func:`require_seconds`, :func:`int_at_least`, :func:`seconds`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, overload

from actorsys._errors import ConfigError

ROLLOUT_ID = "{rollout_id}"
EXIT_USAGE = 2
"""The exit status of a command given a bad argument (argparse's own)."""


@dataclass(frozen=True)
class Flag:
    option: str
    field: str
    parse: Callable[[str], Any]
    metavar: str | None
    help: str
    choices: tuple[str, ...] | None = None
    miles_fallback: str | None = None
    """The trainer's own miles flag (its ``dest``) whose value stands in when this one is unset."""
    switch: bool = False
    """A flag that takes no value (``store_true``, as miles' switches): True when given."""

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
    Flag("--eval-best-metric", "best_metric", str, "METRIC",
         "the metric that ranks the points (e.g. eval/gsm8k), for --eval-keep-best and "
         "patience"),
    Flag("--eval-best-mode", "best_mode", str, "max|min",
         "whether a higher (max) or a lower (min) --eval-best-metric is better",
         choices=("max", "min")),
    Flag("--eval-keep-best", "keep_best", int, "N",
         "snapshots of the N best points kept beside the ring in the staging dir, listed "
         "in best.json"),
    Flag("--eval-interval", "eval_interval", int, "STEPS",
         "evaluate at the steps that are a multiple of this"),
    Flag("--skip-eval-before-train", "skip_eval_before_train", bool, None,
         "do not evaluate step 0", switch=True),
    Flag("--eval-shared-update", "shared_update", str, "POLICY",
         "what the trainer's weight update of a shared fleet does to the served points before "
         "it: wait (for them to settle, within --eval-shared-update-timeout) or preempt (cut "
         "them at once)", choices=("wait", "preempt")),
    Flag("--eval-shared-update-timeout", "shared_update_timeout", float, "SECONDS",
         "seconds a shared fleet's weight update waits for the served points before it"),
    Flag("--eval-resume", "resume", bool, None,
         "after a crash, evaluate again the points the crashed run admitted and never settled "
         "whose snapshots are complete (from the journal in the staging dir, or beside the "
         "--save-hf checkpoints), before new points", switch=True),
)


def add_flag(group: argparse._ArgumentGroup, option: str, **kwargs: Any) -> bool:
    """``group.add_argument(option, **kwargs)`` unless the group's parser already defines
    ``option`` (a trainer's own flag wins; its value is read back under its usual name).
    True if it was added."""
    try:
        group.add_argument(option, **kwargs)
    except argparse.ArgumentError:
        return False
    return True


Check = Callable[["Flag", Any], Any]
"""Checks a flag's parsed value: returns the value to keep or raises :class:`ConfigError`."""


def add_flags(
    group: argparse._ArgumentGroup,
    flags: Iterable[Flag],
    check: Check | None = None,
    *,
    message: Callable[[ConfigError], str] = str,
) -> None:
    """Add each of ``flags`` (unset: None) that the parser lacks, typed by :func:`checked`."""
    for flag in flags:
        if flag.switch:
            add_flag(group, flag.option, dest=flag.dest, action="store_const", const=True,
                     default=None, help=flag.help)
            continue
        add_flag(
            group, flag.option, dest=flag.dest, type=checked(flag, check, message=message),
            choices=flag.choices, default=None, metavar=flag.metavar, help=flag.help,
        )


def checked(
    flag: Flag, check: Check | None = None, *, message: Callable[[ConfigError], str] = str
) -> Callable[[str], Any]:
    """``flag``'s argparse ``type``: ``flag.parse(text)`` (a ``ValueError`` is one line saying
    what the text is not), then ``check(flag, value)`` (a :class:`ConfigError` becomes the
    argparse error ``message(error)``)."""

    def parse(text: str) -> Any:
        try:
            value = flag.parse(text)
        except ValueError as exc:
            kind = {int: "an integer", float: "a number", on_off: "on or off"}.get(
                flag.parse, "valid"
            )
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from exc
        if check is None:
            return value
        try:
            return check(flag, value)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(message(exc)) from exc

    return parse


def add_arguments(
    parser: argparse.ArgumentParser, config_cls: type[Any]
) -> argparse._ArgumentGroup:
    """Add the flags of ``config_cls`` to ``parser`` as one group; return the group."""
    defaults = {f.name: f.default for f in dataclasses.fields(config_cls)}
    group = parser.add_argument_group(
        "evaluation", "non-blocking evaluation of weight snapshots (actorsys)"
    )

    def in_config(flag: Flag, value: Any) -> Any:
        try:
            config_cls(**{flag.field: value})
        except ConfigError as exc:
            # A rule between fields (keep_best needs best_metric) is checked once all are read.
            if exc.field == flag.field:
                raise
        return value

    def with_default(flag: Flag) -> Flag:
        default = defaults[flag.field]
        return dataclasses.replace(
            flag, help=f"{flag.help} (default: {'unset' if default is None else default})"
        )

    add_flags(group, map(with_default, FLAGS), in_config)
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


def _integer(minimum: int) -> str:
    return f"an integer >= {minimum}"


def require_int(name: str, value: object, *, minimum: int) -> int:
    """Return ``value``, or raise :class:`ConfigError` naming ``name``: an int (not a bool) of
    at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(name, f"expected {_integer(minimum)}, got {value!r}")
    return value


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer of at least ``minimum``, else a one-line error."""
    def parse(text: str) -> int:
        try:
            return require_int("value", int(text), minimum=minimum)
        except ValueError:  # ConfigError is one
            raise argparse.ArgumentTypeError(
                f"expected {_integer(minimum)}, got {text!r}"
            ) from None

    parse.__name__ = _integer(minimum)
    return parse


def _seconds(*, optional: bool = False, allow_zero: bool = False) -> str:
    return f"a number of seconds {'>=' if allow_zero else '>'} 0" + (" or None" if optional else "")


@overload
def require_seconds(
    name: str, value: object, *, optional: Literal[False] = False, allow_zero: bool = False
) -> float: ...


@overload
def require_seconds(
    name: str, value: object, *, optional: bool, allow_zero: bool = False
) -> float | None: ...


def require_seconds(
    name: str, value: object, *, optional: bool = False, allow_zero: bool = False
) -> float | None:
    """Return ``value`` as seconds, or raise :class:`ConfigError` naming ``name``: a finite
    number > 0 (>= 0 with ``allow_zero``), or None if ``optional``."""
    if value is None and optional:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not allow_zero)
    ):
        raise ConfigError(name, f"expected {_seconds(optional=optional, allow_zero=allow_zero)}, "
                                f"got {value!r}")
    return float(value)


def seconds(text: str) -> float:
    """An argparse ``type``: a finite number of seconds > 0, else a one-line error."""
    return _parse_seconds(text, allow_zero=False)


def seconds_or_zero(text: str) -> float:
    """An argparse ``type``: a finite number of seconds >= 0, else a one-line error."""
    return _parse_seconds(text, allow_zero=True)


def _parse_seconds(text: str, *, allow_zero: bool) -> float:
    try:
        return require_seconds("seconds", float(text), allow_zero=allow_zero)
    except ValueError:  # ConfigError is one
        raise argparse.ArgumentTypeError(
            f"expected {_seconds(allow_zero=allow_zero)}, got {text!r}"
        ) from None

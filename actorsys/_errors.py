"""The errors actorsys raises, all rooted in :class:`ActorsysError`.

One root, a flat set of precise meanings; each error carries its context as attributes::

    ActorsysError
    ├── ConfigError             (also a ValueError) a config value, argument or staging dir
    │   │                         is unusable; ``field`` names it
    │   └── ConfigTypeError       (also a TypeError) it has the wrong type
    ├── SubmitError             (also a ValueError) a submit call was malformed; ``step``;
    │   │                         nothing changed
    │   └── DuplicateStepError    the step was already submitted
    ├── SupervisorClosedError   submit after close: you closed it
    ├── SupervisorGaveUpError   the actors crashed more than ``max_restarts`` times in
    │                           ``restart_period``; ``__cause__`` is the last crash
    ├── EvalSkip                an eval fn skips its point; ``reason``, ``detail``
    │   └── CompletionError       (fleet.completions) a completion request failed: ``url``,
    │       │                     ``index``; ``reason`` unhealthy
    │       ├── BadRequestError     the server refused the request itself (a 4xx), never
    │       │                       retried; ``reason`` bad_request
    │       └── StaleWeightsError   an answer came from other weights: ``expected``, ``actual``;
    │                               ``reason`` pin_violation
    ├── PinError                (fleet.engine) a pin failed: ``engine``, ``reason``
    │   ├── EngineUnhealthyError    unhealthy
    │   ├── PinViolationError       pin_violation: ``expected``, ``actual``
    │   └── CheckpointRejectedError ckpt_invalid: ``path``
    ├── CheckpointMismatchError (also a ValueError; fleet.checkpoint) a checkpoint does not
    │                           match the served model: ``path``
    ├── FleetStartError         (also a RuntimeError; fleet.local) an engine of a local fleet
    │                           did not come up
    └── WeightsReleasedError    (also a RuntimeError; snapshot) captured weights were read
                                after their release

Every error with a skip reason spells it ``reason``. Failures of an evaluation itself are
never raised to the trainer: they settle the point as skipped with a reason (see
:class:`actorsys.Outcome`).
"""

from __future__ import annotations


class ActorsysError(Exception):
    """Root of every error actorsys raises to its caller."""


class ConfigError(ActorsysError, ValueError):
    """A configuration value is invalid. ``field`` names it; the message names the fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class ConfigTypeError(ConfigError, TypeError):
    """A configuration value or argument has the wrong type."""


class SubmitError(ActorsysError, ValueError):
    """A ``submit`` call was malformed (no source, two sources, a negative step...).

    Raised before anything is admitted: the supervisor's state is unchanged.
    """

    def __init__(self, step: object, message: str) -> None:
        super().__init__(f"submit(step={step!r}): {message}")
        self.step = step


class DuplicateStepError(SubmitError):
    """The step was already submitted to this supervisor; every step is evaluated once."""


class SupervisorClosedError(ActorsysError):
    """The supervisor was closed (``aclose`` or leaving its ``async with``): it admits nothing."""


class SupervisorGaveUpError(ActorsysError):
    """The supervisor stopped after too many actor crashes; it admits nothing more.

    Points in flight when it stopped settled as ``crashed``. ``drain`` and ``aclose`` still
    return their reports. The last crash is ``__cause__``.
    """

"""The errors actorsys raises at its public boundary.

One root, a flat set of precise meanings::

    ActorsysError
    ├── ConfigError            (also a ValueError) a config value or a staging dir is unusable
    ├── SubmitError            (also a ValueError) a submit call was malformed; nothing changed
    │   └── DuplicateStepError   the step was already submitted
    ├── SupervisorClosedError  submit after close: you closed it
    └── SupervisorGaveUpError  the actors crashed more than ``max_restarts`` times in
                               ``restart_period``; ``__cause__`` is the last crash

Failures of an evaluation itself are never raised: they settle the point as skipped with a
reason (see :class:`actorsys.Outcome`).
"""

from __future__ import annotations


class ActorsysError(Exception):
    """Root of every error actorsys raises to its caller."""


class ConfigError(ActorsysError, ValueError):
    """A configuration value is invalid. ``field`` names it; the message names the fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


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

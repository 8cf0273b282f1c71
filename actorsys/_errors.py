"""The errors actorsys raises, all rooted in :class:`ActorsysError`.

One root, a flat set of precise meanings; each error carries its context as attributes::

    ActorsysError
    ├── ConfigError             (also a ValueError) a config value, argument or staging dir
    │   │                         is unusable; ``field`` names it
    │   ├── ConfigTypeError       (also a TypeError) it has the wrong type
    │   ├── StagingInUseError     another live supervisor holds the staging dir: ``path``,
    │   │                         ``pid`` (the holder's, None if it could not be read)
    │   ├── UnsupportedModelError (snapshot) a model in a form its weights cannot be copied
    │   │                         from (FSDP1, ZeRO-3, quantized); ``form`` names it
    │   ├── WatchOutInUseError    (watch.lock) another watch holds its OUT: ``path``, ``pid``
    │   ├── UnsafePathError       (_files) a file of ours is a link, not a regular file,
    │   │                         another user's, or in a directory every user may write:
    │   │                         ``path``
    │   ├── DatasetError          (evals.datasets) a dataset file or eval config is
    │   │                         unusable: ``path``, ``line``, ``key``
    │   └── ChatTemplateMissingError
    │                             (fleet.chat_template) the snapshot's tokenizer has no chat
    │                             template: ``path``; skips with ``no_chat_template``
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
    ├── PinError                (fleet.errors) a pin failed: ``engine``, ``reason``
    │   ├── EngineUnhealthyError    unhealthy
    │   │   └── EngineUnauthorizedError  a 401/403: our key is wrong or missing; never
    │   │                             waited on or retried
    │   ├── PinViolationError       pin_violation: ``expected``, ``actual``
    │   │   └── WeightsMismatchError  (fleet.probe) the right version, other weights:
    │   │                             ``answer``, ``reference``, ``prompt``, ``position``
    │   ├── CheckpointRejectedError ckpt_invalid: ``path``
    │   └── ProbeCancelledError     (fleet.verdict) pin_timeout: the probe was cut off
    │                               before its answers were judged
    ├── ReferenceFailedError    (fleet.probe) the probe's reference could not be computed
    │                           this time; reported on its point, asked again next pin
    ├── CheckpointMismatchError (also a ValueError; fleet.checkpoint) a checkpoint does not
    │                           match the served model: ``path``
    ├── FleetStartError         (also a RuntimeError; fleet.errors) an engine of a local or
    │                           Ray fleet did not come up
    ├── ProbeUnsupportedError   (fleet.probe) the engine cannot answer a token probe: the pin
    │                           checks the version only
    ├── ReferenceUnavailableError
    │                           (fleet.probe) the snapshot cannot give the probe's answer:
    │                           the pin checks the version only
    ├── RemoteRewardError       (evals.remote_rm) a reward server gave no usable reward for
    │                           one answer: it scores 0, counted
    ├── PeerGoneError           (_core.collective_messages) another rank of a
    │                           torch.distributed job did not answer within
    │                           ``collective_timeout``; settles a point as a skip, never
    │                           raised to the trainer
    ├── BadRequest              (also a ValueError; fleet.embedded) a request the embedded
    │   │                         engine refuses, HTTP ``status`` 400; the message names the field
    │   └── BodyTooLarge          a body over the engine's limit, HTTP 413
    ├── GenerationFailed        (also a RuntimeError; fleet.embedded.batching) the model
    │                           raised while generating a batch, HTTP 500
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


class StagingInUseError(ConfigError):
    """The staging dir (``hf_dir``) belongs to another live supervisor, in this process or
    another: one staging dir serves one job at a time. ``pid`` is the holder's process id
    (None if it could not be read). Nothing of the holder's was touched."""

    def __init__(self, path: str, pid: int | None) -> None:
        holder = "another process" if pid is None else f"process {pid}"
        super().__init__(
            "hf_dir",
            f"{path} is in use by {holder} (it holds {path}/.actorsys.lock); give this job its "
            "own hf_dir, or wait until that one closes",
        )
        self.path = path
        self.pid = pid


class UnsupportedModelError(ConfigError):
    """``submit`` / ``prepare`` got a model whose weights actorsys cannot copy as they are
    (FSDP1 flat parameters, DeepSpeed ZeRO-3 partitions, a quantized base, an adapter type
    that cannot be merged). ``form`` names what was found; the message names what is
    supported and the escape hatch, ``export=``. Raised before anything is admitted."""

    def __init__(self, form: str, message: str) -> None:
        super().__init__("model", message)
        self.form = form


class WatchOutInUseError(ConfigError):
    """Another ``watch`` holds the lock of this output directory: ``path`` (the lock file),
    ``pid`` (its holder's, or None if it wrote none)."""

    def __init__(self, path: str, pid: int | None) -> None:
        holder = f"pid {pid}" if pid is not None else "another process"
        super().__init__("out", f"{path} is held by {holder}, a watch on the same OUT; stop it "
                                "or pass another --out")
        self.path = path
        self.pid = pid


class UnsafePathError(ConfigError):
    """A file actorsys writes (a lock, a ledger, a log, a metrics file) cannot be opened
    safely: ``path`` is a symbolic link, not a regular file, another user's file, or lies in
    a directory every user may write. Nothing was written through it."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(path, f"refused: {problem}")
        self.path = path


class DatasetError(ConfigError):
    """A dataset file (or eval config) is unusable. ``path``, ``line`` (1-based, or None) and
    ``key`` (the record key or setting at fault, or None) say where. A message longer than
    :attr:`MAX_MESSAGE` characters is cut (it may quote bad input)."""

    MAX_MESSAGE = 2000

    def __init__(self, path: str, line: int | None, key: str | None, message: str) -> None:
        if len(message) > self.MAX_MESSAGE:  # an excerpt of bad input, never all of it
            message = f"{message[:self.MAX_MESSAGE]}... ({len(message)} characters)"
        where = path if line is None else f"{path}, line {line}"
        Exception.__init__(self, f"{where}: {message}" if key is None else f"{where}: {key}: {message}")
        self.field = key or "path"
        self.path = path
        self.line = line
        self.key = key


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

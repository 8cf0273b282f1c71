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
    │   ├── WatchOutInUseError    (watch) another watch holds its OUT: ``path``, ``pid``
    │   ├── UnsafePathError       a file of ours is a link, not a regular file, another
    │   │                         user's, or in a directory every user may write: ``path``
    │   ├── DatasetError          (evals) a dataset file or eval config is unusable:
    │   │                         ``path``, ``line``, ``key``
    │   └── ChatTemplateMissingError
    │                             (fleet) the snapshot's tokenizer has no chat template:
    │                             ``path``; skips with ``no_chat_template``
    ├── SubmitError             (also a ValueError) a submit call was malformed; ``step``;
    │   │                         nothing changed
    │   └── DuplicateStepError    the step was already submitted
    ├── SupervisorClosedError   submit after close: you closed it
    ├── SupervisorGaveUpError   the actors crashed more than ``max_restarts`` times in
    │                           ``restart_period``; ``__cause__`` is the last crash
    ├── EvalSkip                an eval fn skips its point; ``reason``, ``detail``
    │   └── CompletionError       (fleet) a completion request failed: ``url``, ``index``;
    │       │                     ``reason`` unhealthy
    │       ├── BadRequestError     the server refused the request itself (a 4xx), never
    │       │                       retried; ``reason`` bad_request
    │       └── StaleWeightsError   an answer came from other weights: ``expected``, ``actual``;
    │                               ``reason`` pin_violation
    ├── PinError                (fleet) a pin failed: ``engine``, ``reason``
    │   ├── EngineUnhealthyError    unhealthy
    │   │   └── EngineUnauthorizedError  a 401/403: our key is wrong or missing; never
    │   │                             waited on or retried
    │   ├── PinViolationError       pin_violation: ``expected``, ``actual``
    │   │   ├── WeightsMismatchError  the right version, other weights: ``answer``,
    │   │   │                         ``reference``, ``prompt``, ``position``
    │   │   └── EnginesDisagreeError  (shared fleet) the engines read back the version
    │   │                             but answer the probe as different weights do:
    │   │                             ``dissenters``
    │   ├── CheckpointRejectedError ckpt_invalid: ``path``
    │   └── ProbeCancelledError     pin_timeout: the probe was cut off before its answers
    │                               were judged
    ├── ReferenceFailedError    (fleet) the probe's reference could not be computed this
    │                           time; reported on its point, asked again next pin
    ├── CheckpointMismatchError (also a ValueError; fleet) a checkpoint does not match the
    │                           served model: ``path``
    ├── FleetStartError         (also a RuntimeError; fleet) an engine of a local or Ray
    │                           fleet did not come up
    ├── ProbeUnsupportedError   (fleet) the engine cannot answer a token probe: the pin
    │                           checks the version only
    ├── ReferenceUnavailableError
    │                           (fleet) the snapshot cannot give the probe's answer: the
    │                           pin checks the version only
    ├── RemoteRewardError       (evals) a reward server gave no usable reward for one
    │                           answer: it scores 0, counted
    └── WeightsReleasedError    (also a RuntimeError; snapshot) captured weights were read
                                after their release

Every class of the tree is defined here, and importable from the modules that raise it;
signals that never reach a caller (a request the embedded engine refuses, a collective's rank
that stopped answering) are private to their modules, outside the tree. Every error with a
skip reason spells it ``reason``; an evaluation's own failures are never raised to the
trainer: they settle its point as skipped (see :class:`actorsys.Outcome`).
"""

from __future__ import annotations

from collections.abc import Sequence


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
    another (one job a staging dir); ``pid``: the holder's (None if unreadable). Nothing of
    the holder's was touched."""

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
    """``submit`` / ``prepare`` got a model whose weights cannot be copied as they are (FSDP1
    flat parameters, ZeRO-3 partitions, a quantized base, an adapter that cannot be merged):
    ``form`` names it; the message, what is supported and ``export=``. Nothing is admitted."""

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
    """A file actorsys writes (a lock, a ledger, a log, metrics) cannot be opened safely:
    ``path`` is a link, not a regular file, another user's, or in a directory every user may
    write. Nothing was written through it."""

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
    """A ``submit`` call was malformed (no source, two sources, a negative step...); raised
    before anything is admitted, so the supervisor's state is unchanged."""

    def __init__(self, step: object, message: str) -> None:
        super().__init__(f"submit(step={step!r}): {message}")
        self.step = step


class DuplicateStepError(SubmitError):
    """The step was already submitted to this supervisor; every step is evaluated once."""


class SupervisorClosedError(ActorsysError):
    """The supervisor was closed (``aclose`` or leaving its ``async with``): it admits nothing."""


class SupervisorGaveUpError(ActorsysError):
    """The supervisor stopped after too many actor crashes; it admits nothing more. Points in
    flight settled as ``crashed``; ``drain`` and ``aclose`` still report; the last crash is
    ``__cause__``."""


class ChatTemplateMissingError(ConfigError):
    """The snapshot's tokenizer has no chat template, so a chat prompt cannot be rendered for
    it; ``path`` names the snapshot. An evaluation skips its point with reason
    ``no_chat_template``; the engine answers 400."""

    reason = "no_chat_template"

    def __init__(self, path: str) -> None:
        super().__init__(
            "chat_template",
            f"the tokenizer of {path} has no chat template (tokenizer_config.json's "
            "'chat_template' or chat_template.jinja); a chat prompt cannot be rendered for it: "
            "give the checkpoint its template, or evaluate plain prompts without "
            "apply_chat_template",
        )
        self.path = path


class EvalSkip(ActorsysError):  # noqa: N818 - the name is part of the public contract
    """Raised by an eval fn to skip a point; the outcome is ``skipped`` with ``reason``
    (``detail``, if given, is the error text)."""

    def __init__(self, reason: str, detail: str | None = None) -> None:
        if not reason or not isinstance(reason, str):
            raise ConfigError("EvalSkip(reason)", "reason must be a non-empty string")
        super().__init__(reason if detail is None else f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class CompletionError(EvalSkip):
    """A completion request failed (no answer within its deadline, an error status, a
    malformed body). Raised out of an eval fn it skips the point as ``unhealthy``."""

    reason = "unhealthy"

    def __init__(self, url: str, index: int, message: str, *, retryable: bool = True) -> None:
        super().__init__(type(self).reason, f"prompt {index} at {url}: {message}")
        self.url = url
        self.index = index
        self.retryable = retryable


class BadRequestError(CompletionError):
    """The server refused the request itself (HTTP 4xx: a prompt too long, a value out of
    range, a wrong key): never retried; a point whose requests all failed so skips
    ``bad_request``, not ``unhealthy``."""

    reason = "bad_request"

    def __init__(self, url: str, index: int, message: str) -> None:
        super().__init__(url, index, message, retryable=False)


class StaleWeightsError(CompletionError):
    """An engine answered with weights other than the pinned version: ``pin_violation``."""

    reason = "pin_violation"

    def __init__(self, url: str, index: int, expected: str, actual: str) -> None:
        message = f"answered with weight version {actual!r}; the fleet is pinned to {expected!r}"
        super().__init__(url, index, message, retryable=False)
        self.expected = expected
        self.actual = actual


class PinError(ActorsysError):
    """A pin failed. ``reason`` is the skip reason; ``engine`` the engine that failed it."""

    reason = "unhealthy"

    def __init__(self, engine: str, message: str) -> None:
        super().__init__(f"engine {engine!r}: {message}")
        self.engine = engine


class EngineUnhealthyError(PinError):
    """An engine failed its health check, refused the load, or could not report its version."""


class EngineUnauthorizedError(EngineUnhealthyError):
    """A server refused our requests for want of the right API key (HTTP 401 or 403):
    ``unhealthy``, never waited on (``ready_timeout``) or retried, as a key does not become
    right by asking again."""


class PinViolationError(PinError):
    """An engine kept reporting a version other than the one it was asked to load."""

    reason = "pin_violation"

    def __init__(
        self, engine: str, expected: str, actual: str | None, *, message: str | None = None
    ) -> None:
        super().__init__(
            engine, message or f"serves version {actual!r} after loading {expected!r}"
        )
        self.expected = expected
        self.actual = actual


class WeightsMismatchError(PinViolationError):
    """An engine reads back the right version but computes something the snapshot does not.
    ``answer``, ``reference``: the engine's and the snapshot's greedy tokens a probe prompt
    (with ``prefill``, the log-probabilities of the fixed continuation); ``prompt``,
    ``position``: the first clear disagreement (the widest difference); ``gap``: how far the
    snapshot puts the engine's token below its own choice; ``margin``: a near-tie's bound."""

    def __init__(
        self,
        engine: str,
        version: str,
        *,
        answer: list[list[int]] | list[list[float]],
        reference: list[list[int]] | list[list[float]],
        prompt: int,
        position: int,
        gap: float,
        margin: float,
        prefill: bool = False,
    ) -> None:
        if prefill:
            detail = (
                f"probe sequence {prompt}: the engine's log-probabilities of the fixed "
                f"continuation {_rounded(answer[prompt])}, the snapshot's "
                f"{_rounded(reference[prompt])} (token {position} differs by {gap:.3g}; "
                f"numerics may move one by {margin:.3g})"
            )
        else:
            detail = (
                f"probe prompt {prompt}, token {position}: the engine answered "
                f"{answer[prompt]}, the snapshot answers {reference[prompt]} (the engine's "
                f"token is {gap:.3g} below the snapshot's choice in log-probability; a "
                f"near-tie is within {margin:.3g})"
            )
        PinError.__init__(
            self,
            engine,
            f"reads back version {version!r} but does not serve its weights: {detail}",
        )
        self.prefill = prefill
        self.expected = version
        self.actual = version
        self.answer = answer
        self.reference = reference
        self.prompt = prompt
        self.position = position
        self.gap = gap
        self.margin = margin


class EnginesDisagreeError(PinViolationError):
    """The engines of a shared fleet (judged by each other, having no snapshot) all read back
    ``expected`` but answer the probe unlike: ``dissenters`` answer as other weights do than
    the strict majority, or, with no strict majority, every engine is named."""

    def __init__(self, version: str, dissenters: list[str], detail: str) -> None:
        super().__init__(
            dissenters[0] if len(dissenters) == 1 else "fleet", version, version,
            message=f"reads back version {version!r} but the engines disagree: {detail}",
        )
        self.dissenters = dissenters


class CheckpointRejectedError(PinError):
    """An engine refused the checkpoint, or it was found unloadable before any was asked
    (missing, incomplete, corrupt, another architecture); the engines keep their weights."""

    reason = "ckpt_invalid"

    def __init__(self, engine: str, path: str, message: str) -> None:
        super().__init__(engine, f"rejected checkpoint {path}: {message}")
        self.path = path


class ProbeCancelledError(PinError):
    """The pin's probe was cut off before its answers were judged (the pin deadline, or the
    pin's owner stopped)."""

    reason = "pin_timeout"


class ReferenceFailedError(ActorsysError):
    """The snapshot's answer could not be computed this time (the reference worker crashed or
    ran out of memory, transformers failed): on the verdict (``PinVerdict.unverified``); the
    next pin asks again."""


class CheckpointMismatchError(ActorsysError, ValueError):
    """A checkpoint cannot be loaded in place of the served one. The message says why."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


class FleetStartError(ActorsysError, RuntimeError):
    """A local fleet's process or a Ray fleet's engine did not come up; the message holds its
    log's tail."""


class ProbeUnsupportedError(ActorsysError):
    """The engine has no way to answer a token probe (the pin then checks the version only)."""


class ReferenceUnavailableError(ActorsysError):
    """The snapshot has no config for the probe's prompts (the pin checks the version only)."""


class RemoteRewardError(ActorsysError):
    """A reward server gave no usable reward for one answer (it scores 0, counted)."""


class WeightsReleasedError(ActorsysError, RuntimeError):
    """The weights were released while (or before) a writer read them: the export was
    abandoned, and its buffers may already hold another point's weights."""


def _rounded(values: Sequence[float | int]) -> list[float | int]:
    return [round(v, 2) if isinstance(v, float) else v for v in values]

"""The rollout-function contracts shared with the miles / slime / vime ecosystem.

An evaluation is a :class:`CheckpointEvalFn`: the supervisor calls
``evaluate_checkpoint(checkpoint_dir, input)`` once per point, with the engines of the fleet
already pinned to that checkpoint. Raise :class:`EvalSkip` to skip the point with a reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from actorsys._errors import (
    ConfigTypeError,
    EvalSkip,  # noqa: F401 - defined there, imported from here
)

Runtime = Literal["trio", "asyncio", "thread"]
RUNTIMES: tuple[Runtime, ...] = ("trio", "asyncio", "thread")


class EvalFleet(Protocol):
    """The fleet an eval fn is handed as ``input.fleet`` (an :class:`actorsys.Fleet`), pinned
    to the point's checkpoint: ``version`` every engine serves, where to send requests
    (``base_url``, ``urls``, with ``api_key``), and ``complete``, which checks each answer's
    version (see ``Fleet.complete``)."""

    @property
    def version(self) -> str | None: ...

    @property
    def urls(self) -> list[str]: ...

    @property
    def base_url(self) -> str | None: ...

    @property
    def api_key(self) -> str | None: ...

    async def complete(
        self,
        prompts: Sequence[str | Sequence[int]],
        *,
        max_tokens: int | Sequence[int] = ...,
        temperature: float = ...,
        concurrency: int = ...,
        request_timeout: float = ...,
        check_version: bool = ...,
        model: str | None = ...,
        api_key: str | None = ...,
        extra: Mapping[str, Any] | None = ...,
        retries: int = ...,
        keep_failures: bool = ...,
    ) -> list[Any]: ...


@dataclass(frozen=True)
class RolloutFnConstructorInput:
    """What a rollout fn is built from: the launch arguments and its data source."""

    args: Any = None
    data_source: Any = None


@dataclass(frozen=True)
class RolloutFnBaseInput:
    rollout_id: int

    @property
    def evaluation(self) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class RolloutFnTrainInput(RolloutFnBaseInput):
    @property
    def evaluation(self) -> bool:
        return False


@dataclass(frozen=True)
class RolloutFnEvalInput(RolloutFnBaseInput):
    """One evaluation point.

    ``rollout_id`` is the training step the weights come from, ``weight_version`` the version
    label every engine of ``fleet`` was pinned to (``str(step)``, or the ``served`` version),
    ``hf_dir`` the checkpoint (None for a ``served`` point: the weights are those the shared
    fleet serves, and there is no snapshot). ``base_checkpoint`` is
    ``EvalConfig.base_checkpoint``: where an eval fn finds the model's tokenizer, chat
    template and config when there is no checkpoint (never the weights evaluated).
    """

    weight_version: str | None = None
    hf_dir: str | None = None
    fleet: EvalFleet | None = None
    base_checkpoint: str | None = None

    @property
    def evaluation(self) -> bool:
        return True


def model_files(checkpoint_dir: str | None, input: RolloutFnEvalInput) -> str | None:  # noqa: A002
    """Where an eval fn reads the model's tokenizer, chat template and config for a point:
    its checkpoint, or for a ``served`` point (no checkpoint) ``input.base_checkpoint``;
    None where there is neither. Never a source of weights to evaluate."""
    return checkpoint_dir if checkpoint_dir is not None else input.base_checkpoint


@dataclass(frozen=True)
class RolloutFnTrainOutput:
    samples: Any
    metrics: dict[str, Any] | None = None


@dataclass(frozen=True)
class RolloutFnEvalOutput:
    """What an evaluation returns: ``data`` (free-form, per dataset) and scalar ``metrics``."""

    data: Any = field(default_factory=dict)
    metrics: dict[str, float] | None = None


class BaseRolloutFn:
    """A rollout function: ``fn(input)`` produces samples (train) or scores (eval).

    ``save`` and ``load`` persist the function's own state at a rollout id; the defaults keep
    none.
    """

    def __init__(self, input: RolloutFnConstructorInput | None = None) -> None:  # noqa: A002
        self.constructor_input = input

    def __call__(self, input: RolloutFnBaseInput) -> Any:  # noqa: A002
        raise NotImplementedError(f"{type(self).__name__} does not implement __call__")

    def save(self, rollout_id: int) -> None:
        """Persist state belonging to ``rollout_id``. The default keeps nothing."""

    def load(self, rollout_id: int) -> None:
        """Restore state saved at ``rollout_id``. The default restores nothing."""


class CheckpointEvalFn(BaseRolloutFn):
    """An evaluation of one checkpoint directory; subclass it and implement
    ``evaluate_checkpoint``.

    ``runtime`` says how the supervisor runs it:

    - ``"trio"`` (default): ``async def evaluate_checkpoint``, awaited in the supervisor's trio
      tasks and cancelled by its cancel scopes (``eval_timeout``, close).
    - ``"asyncio"``: ``async def``, run on a private asyncio loop in a dedicated thread (the
      host's asyncio is never touched); cancellation cancels the asyncio task.
    - ``"thread"``: a plain ``def``, run in a worker thread. A thread cannot be interrupted:
      on timeout or close it is abandoned (reported in ``CloseReport.stuck_threads``).

    Subclasses may define ``__init__`` freely: the supervisor relies on no attribute the base
    ``__init__`` sets.

    A ``served`` point (``submit(step, served=...)``, evaluated on the trainer's own engines)
    has no checkpoint: ``checkpoint_dir`` is None, and what an eval fn needs of the model's
    files (its tokenizer) is in ``input.base_checkpoint``.
    """

    runtime: ClassVar[Runtime] = "trio"

    def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:  # noqa: A002
        raise NotImplementedError(f"{type(self).__name__} does not implement evaluate_checkpoint")

    def __call__(self, input: RolloutFnBaseInput) -> Any:  # noqa: A002
        if not isinstance(input, RolloutFnEvalInput) or input.hf_dir is None:
            raise ConfigTypeError(
                "input", "a CheckpointEvalFn is called with a RolloutFnEvalInput that has hf_dir"
            )
        return self.evaluate_checkpoint(input.hf_dir, input)

    def dispose(self) -> None:
        """Release what the eval fn holds (clients, engines). Called once, at close."""


class EvalFn(Protocol):
    """What ``EvalSupervisor.open(eval_fn=...)`` takes: a :class:`CheckpointEvalFn`, or any
    object with its ``evaluate_checkpoint(checkpoint_dir, input)`` (``async def``, or a plain
    ``def`` with ``runtime = "thread"``; ``runtime`` as :class:`CheckpointEvalFn` says)."""

    def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput, /) -> Any:  # noqa: A002
        ...

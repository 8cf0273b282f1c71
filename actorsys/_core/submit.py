"""The arguments of ``submit``, written once, and their validation into the point they admit.

:class:`SubmitArguments` is the one list of ``submit``'s keyword arguments:
``EvalSupervisor.submit`` and both bridges' ``submit`` take ``**arguments:
Unpack[SubmitArguments]`` and build a :class:`SubmitRequest` from them; everything after that
(validation, admission, the weight copy) takes the request.
"""

from __future__ import annotations

import os
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

import torch

from actorsys._errors import ConfigError, DuplicateStepError, SubmitError, UnsupportedModelError
from actorsys.actors.point import ExportFn, Point, Source
from actorsys.config import EvalConfig
from actorsys.snapshot import StatePlan, plan_state

SOURCES = ("model", "state_dict", "export", "checkpoint_dir", "served")


class SubmitArguments(TypedDict, total=False):
    """The keyword arguments of ``submit(step, ...)``; see :meth:`actorsys.EvalSupervisor.submit`.

    Exactly one source (``model``, ``state_dict``, ``export``, ``checkpoint_dir``, ``served``),
    or none in reuse mode; ``require_marker`` only with ``checkpoint_dir``; ``force`` never
    drops."""

    model: torch.nn.Module | None
    state_dict: Mapping[str, torch.Tensor] | None
    export: ExportFn | None
    checkpoint_dir: str | os.PathLike[str] | None
    served: bool | str | None
    require_marker: bool | None
    force: bool


class SubmitRequest:
    """One ``submit(step, **arguments)``, as a host hands it to ``EvalSupervisor.reserve``.

    Raises :class:`~actorsys.SubmitError` for a keyword ``submit`` does not take.
    """

    __slots__ = ("arguments", "step")

    def __init__(self, step: int, **arguments: Unpack[SubmitArguments]) -> None:
        unknown = sorted(set(arguments) - set(SubmitArguments.__annotations__))
        if unknown:
            raise SubmitError(step, f"unknown argument {', '.join(unknown)}")
        self.step = step
        self.arguments: SubmitArguments = arguments

    def __repr__(self) -> str:
        given = ", ".join(f"{k}=..." for k, v in self.arguments.items() if v is not None)
        return f"SubmitRequest({self.step!r}{', ' if given else ''}{given})"

    @property
    def force(self) -> bool:
        return self.arguments.get("force", False)

    @property
    def weights_source(self) -> torch.nn.Module | Mapping[str, torch.Tensor] | None:
        """What the weight copy reads: the model or the state dict, if either was given."""
        model = self.arguments.get("model")
        return model if model is not None else self.arguments.get("state_dict")


@dataclass(frozen=True)
class FleetKinds:
    """Which kinds of fleet a supervisor lends: ``shared`` ones (for ``served`` points) and
    ``dedicated`` ones (every other point; ``fleet=None`` counts as one)."""

    shared: bool
    dedicated: bool


DEDICATED_ONLY = FleetKinds(shared=False, dedicated=True)


def check_submit(
    request: SubmitRequest,
    config: EvalConfig,
    submitted: Container[int],
    fleets: FleetKinds = DEDICATED_ONLY,
) -> tuple[Point, StatePlan | None]:
    """The point ``request`` admits and, for weights, the plan of their copy.

    Raises :class:`~actorsys.SubmitError` (naming the argument and the fix) for a malformed
    request, :class:`~actorsys.DuplicateStepError` for a step in ``submitted``,
    :class:`~actorsys.UnsupportedModelError` for a model whose form cannot be copied, and
    :class:`~actorsys.ConfigError` for a point no fleet of the supervisor takes (``served``
    with no shared fleet, another source when every fleet is shared).
    """
    args: Mapping[str, Any] = request.arguments
    step, force, require_marker = request.step, request.force, args.get("require_marker")
    checkpoint_dir, export = args.get("checkpoint_dir"), args.get("export")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise SubmitError(step, "step must be an integer >= 0")
    if step in submitted:
        raise DuplicateStepError(step, "this step was already submitted; each step is evaluated once")
    # served=False is no source at all (the flag a trainer passes through unchanged).
    given = [
        name for name in SOURCES
        if args.get(name) is not None and not (name == "served" and args.get(name) is False)
    ]
    if len(given) > 1:
        raise SubmitError(step, f"pass exactly one source, got {', '.join(sorted(given))}")
    if not isinstance(force, bool):
        raise SubmitError(step, f"force must be a bool, got {force!r}")
    if require_marker is not None and not isinstance(require_marker, bool):
        raise SubmitError(step, f"require_marker must be a bool or None, got {require_marker!r}")
    if given == ["served"]:
        return _served_point(step, force, args["served"], require_marker, fleets), None
    if not fleets.dedicated:
        raise ConfigError(
            "submit(served)", f"step {step}: every fleet of this supervisor is shared (the "
            "trainer's own engines), so it evaluates only submit(step, served=True); pass a "
            "fleet that is not shared for exported points",
        )
    if not given:
        reuse = config.reuse_path(step)
        if reuse is None or config.staging_dir is not None:
            raise SubmitError(
                step,
                "no source: pass one of model=, state_dict=, export=, checkpoint_dir= "
                "(or set EvalConfig.save_hf without hf_dir to reuse the trainer's checkpoints)",
            )
        marker = True if require_marker is None else require_marker
        return Point(step, Source.CHECKPOINT, force, checkpoint=reuse, require_marker=marker), None
    if require_marker is not None and checkpoint_dir is None:
        raise SubmitError(step, "require_marker applies only to checkpoint_dir=")
    if checkpoint_dir is not None:
        if not isinstance(checkpoint_dir, str | os.PathLike):
            raise SubmitError(step, f"checkpoint_dir must be a path, got {checkpoint_dir!r}")
        path = os.path.abspath(os.fspath(checkpoint_dir))
        marker = bool(require_marker)
        return Point(step, Source.CHECKPOINT, force, checkpoint=path, require_marker=marker), None
    if config.staging_dir is None:
        raise SubmitError(step, f"{given[0]}= needs EvalConfig.hf_dir to export into")
    if export is not None:
        if not callable(export):
            raise SubmitError(step, f"export must be an async callable (step, path), got {export!r}")
        return Point(step, Source.EXPORT, force, export=export), None
    model, state_dict = args.get("model"), args.get("state_dict")
    if model is not None and not isinstance(model, torch.nn.Module):
        raise SubmitError(step, f"model must be a torch.nn.Module, got {type(model).__name__}")
    if state_dict is not None and not isinstance(state_dict, Mapping):
        kind = type(state_dict).__name__
        raise SubmitError(step, f"state_dict must be a mapping of tensors, got {kind}")
    source = request.weights_source
    assert source is not None
    try:
        plan = plan_state(source)
    except UnsupportedModelError:
        raise
    except (TypeError, ValueError) as exc:
        raise SubmitError(step, str(exc)) from exc
    return Point(step, Source.WEIGHTS, force), plan


def _served_point(
    step: int, force: bool, served: object, require_marker: bool | None, fleets: FleetKinds
) -> Point:
    """The point of ``submit(step, served=...)``: the version the shared fleets serve now
    (``True``: ``str(step)``; a string: that version)."""
    if require_marker is not None:
        raise SubmitError(step, "require_marker applies only to checkpoint_dir=")
    if served is True:
        version = str(step)
    elif isinstance(served, str) and served.strip() and served.isprintable():
        version = served
    else:
        raise SubmitError(
            step, f"served must be True (the version is the step) or the version string the "
            f"trainer labels its engines with, got {served!r}",
        )
    if not fleets.shared:
        raise ConfigError(
            "submit(served)", f"step {step}: served= evaluates the weights a shared fleet "
            "serves, and this supervisor has none (pass Fleet(engines, shared=True))",
        )
    return Point(step, Source.SERVED, force, weight_version=version)

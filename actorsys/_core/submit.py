"""A submit call as one frozen request, and its validation into the point it admits.

``EvalSupervisor.submit`` and both bridges build a :class:`SubmitRequest` from their keyword
arguments; everything after that (validation, admission, the weight copy) takes the request.
"""

from __future__ import annotations

import os
from collections.abc import Container, Mapping
from dataclasses import dataclass

import torch

from actorsys._core.point import ExportFn, Point, Source
from actorsys._errors import DuplicateStepError, SubmitError, UnsupportedModelError
from actorsys.config import EvalConfig
from actorsys.snapshot import StatePlan, plan_state


@dataclass(frozen=True, eq=False)
class SubmitRequest:
    """The arguments of one ``submit(step, ...)``; see :meth:`actorsys.EvalSupervisor.submit`."""

    step: int
    model: torch.nn.Module | None = None
    state_dict: Mapping[str, torch.Tensor] | None = None
    export: ExportFn | None = None
    checkpoint_dir: str | os.PathLike[str] | None = None
    require_marker: bool | None = None
    force: bool = False

    @property
    def weights_source(self) -> torch.nn.Module | Mapping[str, torch.Tensor] | None:
        """What the weight copy reads: the model or the state dict, if either was given."""
        return self.model if self.model is not None else self.state_dict


def check_submit(
    request: SubmitRequest, config: EvalConfig, submitted: Container[int]
) -> tuple[Point, StatePlan | None]:
    """The point ``request`` admits and, for weights, the plan of their copy.

    Raises :class:`~actorsys.SubmitError` (naming the argument and the fix) for a malformed
    request, :class:`~actorsys.DuplicateStepError` for a step in ``submitted`` and
    :class:`~actorsys.UnsupportedModelError` for a model whose form cannot be copied.
    """
    step, force, require_marker = request.step, request.force, request.require_marker
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise SubmitError(step, "step must be an integer >= 0")
    if step in submitted:
        raise DuplicateStepError(step, "this step was already submitted; each step is evaluated once")
    given = [
        name
        for name in ("model", "state_dict", "export", "checkpoint_dir")
        if getattr(request, name) is not None
    ]
    if len(given) > 1:
        raise SubmitError(step, f"pass exactly one source, got {', '.join(sorted(given))}")
    if not isinstance(force, bool):
        raise SubmitError(step, f"force must be a bool, got {force!r}")
    if require_marker is not None and not isinstance(require_marker, bool):
        raise SubmitError(step, f"require_marker must be a bool or None, got {require_marker!r}")
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
    if require_marker is not None and request.checkpoint_dir is None:
        raise SubmitError(step, "require_marker applies only to checkpoint_dir=")
    if request.checkpoint_dir is not None:
        checkpoint_dir = request.checkpoint_dir
        if not isinstance(checkpoint_dir, str | os.PathLike):
            raise SubmitError(step, f"checkpoint_dir must be a path, got {checkpoint_dir!r}")
        path = os.path.abspath(os.fspath(checkpoint_dir))
        marker = bool(require_marker)
        return Point(step, Source.CHECKPOINT, force, checkpoint=path, require_marker=marker), None
    if config.staging_dir is None:
        raise SubmitError(step, f"{given[0]}= needs EvalConfig.hf_dir to export into")
    if request.export is not None:
        if not callable(request.export):
            raise SubmitError(
                step, f"export must be an async callable (step, path), got {request.export!r}"
            )
        return Point(step, Source.EXPORT, force, export=request.export), None
    model, state_dict = request.model, request.state_dict
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

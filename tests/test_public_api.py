import importlib
import pkgutil
import re
from types import ModuleType

import pytest

import actorsys
import bridge
from actorsys.fleet import CheckpointRejectedError, StaleWeightsError

EXPECTED = {
    "ActorsysError",
    "BaseRolloutFn",
    "BestPoint",
    "CheckpointEvalFn",
    "CloseReport",
    "ConfigError",
    "DatasetError",
    "DatasetEval",
    "DrainReport",
    "DuplicateStepError",
    "Engine",
    "EngineUnhealthyError",
    "EvalConfig",
    "EvalDataset",
    "EvalSkip",
    "EvalSupervisor",
    "Fleet",
    "JsonlSink",
    "LmEvalTasks",
    "MemorySink",
    "Outcome",
    "PinError",
    "PinViolationError",
    "RolloutFnConstructorInput",
    "RolloutFnEvalInput",
    "RolloutFnEvalOutput",
    "RolloutFnTrainInput",
    "RolloutFnTrainOutput",
    "SGLangEngine",
    "ServerEvalFn",
    "StagingInUseError",
    "SubmitError",
    "SupervisorClosedError",
    "SupervisorGaveUpError",
    "SupervisorStatistics",
    "TensorBoardSink",
    "UnsupportedModelError",
    "VLLMEngine",
    "WandbSink",
    "WatchOutInUseError",
    "datasets_from_args",
    "load_eval_config",
    "score",
}


def test_all_is_pinned() -> None:
    assert set(actorsys.__all__) == EXPECTED


def test_every_public_name_is_importable() -> None:
    for name in actorsys.__all__:
        assert getattr(actorsys, name) is not None


def public_modules() -> list[ModuleType]:
    """Every module of actorsys and bridge a caller may import: no ``_`` in its path."""
    modules = []
    for package in (actorsys, bridge):
        modules.append(package)
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            parts = info.name.split(".")
            if any(part.startswith("_") for part in parts):
                continue
            modules.append(importlib.import_module(info.name))
    return modules


def public_exceptions() -> dict[str, type[BaseException]]:
    """The exceptions each public module exports (its ``__all__``) or defines."""
    found: dict[str, type[BaseException]] = {}
    for module in public_modules():
        names = getattr(module, "__all__", None) or [
            name for name, value in vars(module).items()
            if isinstance(value, type) and value.__module__.startswith(module.__name__)
        ]
        for name in names:
            value = getattr(module, name)
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and not name.startswith("_")
            ):
                found[f"{module.__name__}.{name}"] = value
    return found


def test_the_scan_sees_the_errors_of_every_public_module() -> None:
    names = {name.rsplit(".", 1)[1] for name in public_exceptions()}
    assert {
        "ConfigError", "SubmitError", "DuplicateStepError", "SupervisorClosedError",
        "SupervisorGaveUpError", "EvalSkip", "PinError", "EngineUnhealthyError",
        "PinViolationError", "CheckpointRejectedError", "CompletionError",
        "StaleWeightsError", "FleetStartError", "CheckpointMismatchError",
        "WeightsReleasedError",
    } <= names


def test_every_exported_error_has_the_one_root() -> None:
    unrooted = sorted(
        name for name, error in public_exceptions().items()
        if not issubclass(error, actorsys.ActorsysError)
    )
    assert unrooted == []


def test_every_exported_error_is_drawn_in_the_tree() -> None:
    tree = importlib.import_module("actorsys._errors").__doc__ or ""
    drawn = {"ActorsysError", *re.findall(r"[└├]── (\w+)", tree)}
    undrawn = sorted(
        name for name, error in public_exceptions().items() if error.__name__ not in drawn
    )
    assert undrawn == []


def test_every_error_with_a_skip_reason_spells_it_reason() -> None:
    for name, error in public_exceptions().items():
        assert not hasattr(error, "skip_reason"), name
    assert actorsys.PinViolationError.reason == "pin_violation"
    assert CheckpointRejectedError.reason == "ckpt_invalid"
    assert StaleWeightsError.reason == "pin_violation"
    assert actorsys.EvalSkip("no_data").reason == "no_data"


def test_argument_errors_stay_value_and_type_errors() -> None:
    with pytest.raises(actorsys.ConfigError) as empty:
        actorsys.Fleet([])
    assert isinstance(empty.value, ValueError) and empty.value.field == "Fleet(engines)"
    with pytest.raises(actorsys.ConfigError) as wrong:
        actorsys.Fleet([object()])  # type: ignore[list-item]
    assert isinstance(wrong.value, TypeError)

import ast
import builtins
import importlib
import inspect
import os
import pkgutil
import re
import typing
from pathlib import Path
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
    """The exceptions each public module exports (its ``__all__``) or holds under a public
    name (defined there or imported from actorsys's own modules)."""
    found: dict[str, type[BaseException]] = {}
    for module in public_modules():
        names = getattr(module, "__all__", None) or [
            name for name, value in vars(module).items()
            if isinstance(value, type) and value.__module__.startswith("actorsys")
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


ROOT = Path(__file__).resolve().parent.parent


def exception_classes_defined_outside_errors() -> list[str]:
    """``path: Class`` for each public exception class of actorsys and bridge defined outside
    ``actorsys/_errors.py``, read from the source (no optional extra is imported): a class
    is an exception if one of its bases is a builtin exception or an exception class of the
    package."""
    classes: dict[str, tuple[str, list[str]]] = {}
    for package in ("actorsys", "bridge"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = [b.id if isinstance(b, ast.Name) else b.attr
                             for b in node.bases if isinstance(b, ast.Name | ast.Attribute)]
                    classes[f"{path.relative_to(ROOT)}: {node.name}"] = (node.name, bases)
    exceptions = {name for name, value in vars(builtins).items()
                  if isinstance(value, type) and issubclass(value, BaseException)}
    while True:
        more = {name for name, bases in classes.values() if exceptions & set(bases)} - exceptions
        if not more:
            break
        exceptions |= more
    return sorted(
        where for where, (name, _) in classes.items()
        if name in exceptions and not name.startswith("_")
        and not where.startswith(f"actorsys{os.sep}_errors.py")
    )


def test_every_public_exception_class_is_defined_in_errors() -> None:
    assert exception_classes_defined_outside_errors() == []


def test_the_error_scan_finds_an_exception_class_through_its_base() -> None:
    errors = importlib.import_module("actorsys._errors")
    assert inspect.getsourcefile(errors.PinViolationError) == str(ROOT / "actorsys" / "_errors.py")
    private = importlib.import_module("actorsys.fleet.embedded.requests")
    assert issubclass(private._BodyTooLarge, ValueError)
    assert not issubclass(private._BodyTooLarge, actorsys.ActorsysError)


def type_checking_imports(package: ModuleType) -> dict[str, str]:
    """Name -> module of the imports under ``if TYPE_CHECKING:`` in ``package``'s ``__init__``."""
    tree = ast.parse(Path(package.__file__ or "").read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    return {alias.name: node.module or "" for node in block.body
            if isinstance(node, ast.ImportFrom) for alias in node.names}


def defines(module_name: str, name: str) -> bool:
    """Whether ``module_name`` defines ``name`` itself (a class, a function or an assignment,
    not an import)."""
    value = getattr(importlib.import_module(module_name), name)
    if isinstance(value, type) or callable(value):
        return getattr(value, "__module__", None) == module_name
    source = Path(importlib.import_module(module_name).__file__ or "").read_text()
    return any(isinstance(node, ast.Assign | ast.AnnAssign) and name in {
        t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Name)} for node in ast.parse(source).body)


@pytest.mark.parametrize("package", ["actorsys", "actorsys.evals"])
def test_the_public_surface_is_written_once_and_maps_each_name_to_its_defining_module(
    package: str,
) -> None:
    module = importlib.import_module(package)
    public: dict[str, str] = module.PUBLIC
    assert module.__all__ == sorted(public)
    assert type_checking_imports(module) == public
    wrong = sorted(f"{name} -> {home}" for name, home in public.items() if not defines(home, name))
    assert wrong == []


def test_what_users_touch_is_typed() -> None:
    from actorsys.contracts import RolloutFnEvalInput
    from actorsys.supervisor import EvalSupervisor

    fleet = typing.get_type_hints(RolloutFnEvalInput)["fleet"]
    assert fleet is not typing.Any and "EvalFleet" in str(fleet)
    for function in (EvalSupervisor.__init__, EvalSupervisor.open):
        assert inspect.signature(function).parameters["eval_fn"].annotation == "EvalFn"

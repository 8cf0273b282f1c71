"""The import graph of actorsys and bridge, read from their source: bridge imports nothing
private of actorsys, no package of actorsys imports another's private modules, bench/ and
examples/ import nothing private, no module imports one of a higher layer, the contracts import
only contracts (and the shared leaves), the actors nothing of the core, and no two modules
import each other, directly or through others, type-only imports (under ``TYPE_CHECKING``)
counted; and no package or module grows past its size."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("actorsys", "bridge")

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"_errors", "_files", "_http", "_lazy", "_flags", "_lock", "_jsonl", "flag_groups",
               "runtime"}),
    frozenset({"config", "contracts", "staging"}),
    frozenset({"outcome", "snapshot", "fleet", "sinks", "metrics_file"}),
    frozenset({"evals", "_core", "actors"}),
    frozenset({"supervisor", "__init__"}),
    frozenset({"watch", "integrations", "demo", "bridge"}),
    frozenset({"cli"}),
    frozenset({"__main__"}),
)
"""From the bottom up; a unit (a top-level module or package of actorsys, or bridge) may import
its own layer and those below. ``__init__`` is the package ``actorsys`` itself, the public
face: everything above it may use it."""


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(body: list[ast.stmt], *, type_checking: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of ``body``, wherever they stand (in functions and classes too: an
    import a function makes is still a dependency); without ``type_checking``, not those under
    ``if TYPE_CHECKING:``, which never runs and so can form no import cycle."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and not type_checking and _is_type_checking(node):
            continue
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    stmts = [c for c in children if isinstance(c, ast.stmt)]
                    stmts += [s for h in children if isinstance(h, ast.ExceptHandler) for s in h.body]
                    yield from _statements(stmts, type_checking=type_checking)


def imports(name: str, *, type_checking: bool) -> set[str]:
    """The actorsys and bridge modules ``name`` imports (``from pkg import sub`` names ``sub``)."""
    path = MODULES[name]
    is_package = path.name == "__init__.py"
    found = set()
    for node in _statements(ast.parse(path.read_text()).body, type_checking=type_checking):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module
                for alias in node.names
            ]
        found.update(t for t in targets if t in MODULES and t != name)
    return found


def unit(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "bridge":
        return "bridge"
    return parts[1] if len(parts) > 1 else "__init__"


def layer(name: str) -> int:
    for index, units in enumerate(LAYERS):
        if unit(name) in units:
            return index
    raise AssertionError(f"{name} belongs to no layer: add {unit(name)!r} to LAYERS")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def imports_where(package: str, wrong: Callable[[str, str], bool]) -> set[tuple[str, str]]:
    """(module, target) for each import of a module of ``package`` that is ``wrong(module,
    target)``, those under ``if TYPE_CHECKING:`` included."""
    return {
        (name, target)
        for name in MODULES
        if name.split(".")[0] == package
        for target in imports(name, type_checking=True)
        if wrong(name, target)
    }


def test_bridge_imports_no_private_actorsys_module() -> None:
    private = imports_where("bridge", lambda name, target: target.startswith("actorsys") and any(
        p.startswith("_") for p in target.split(".")))
    assert private == set()


KNOWN_PRIVATE_IMPORTS: set[tuple[str, str]] = set()


def private_to(target: str) -> str | None:
    """The unit whose private module ``target`` is, or None for a module any unit may import.

    The rule: a module whose path below its unit has a part starting with ``_``
    (``actorsys.snapshot._write.write``, ``actorsys.fleet.embedded._x``) belongs to that unit (a
    top-level module or package of actorsys) alone; other units reach it only through the
    unit's public modules. The top-level private modules and packages (``actorsys._errors``,
    ``_files``, ``_http``, ``_flags``, ``_lock``, ``_jsonl``, ``_core``) are actorsys's shared
    leaves and its private core: any unit of actorsys may import them (not bridge/, bench/ or
    examples/, which use actorsys as its users do)."""
    parts = target.split(".")
    if parts[0] != "actorsys" or not any(part.startswith("_") for part in parts[2:]):
        return None
    return unit(target)


def test_no_package_imports_another_ones_private_module() -> None:
    crossing = imports_where(
        "actorsys", lambda name, target: private_to(target) not in (None, unit(name))
    )
    assert crossing == KNOWN_PRIVATE_IMPORTS


def user_imports(path: Path) -> set[str]:
    """What a script outside the packages imports of actorsys: modules, and ``module.name``
    for each name it takes from a module."""
    found = set()
    for node in _statements(ast.parse(path.read_text()).body, type_checking=True):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif node.module and not node.level:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] == "actorsys"}


def test_bench_and_examples_import_nothing_private() -> None:
    private = {
        f"{path.relative_to(ROOT)}: {name}"
        for folder in ("bench", "examples")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for name in user_imports(path)
        if any(part.startswith("_") for part in name.split(".")[1:])
    }
    assert private == set()


def test_the_private_import_checks_see_a_crossing() -> None:
    assert private_to("actorsys.fleet._proc.process") == "fleet"
    assert private_to("actorsys.fleet.embedded._x") == "fleet"
    assert private_to("actorsys._files") is None and private_to("actorsys._core.admission") is None
    assert private_to("actorsys.snapshot") is None
    script = ROOT / "bench" / "export.py"
    assert "actorsys.snapshot.fsync_tree" in user_imports(script)


def test_no_module_imports_one_of_a_higher_layer() -> None:
    upward = {
        f"{name} -> {target}"
        for name in MODULES
        for target in imports(name, type_checking=True)
        if layer(target) > layer(name)
    }
    assert upward == set()


CONTRACTS = frozenset({"config", "contracts", "outcome", "staging"})
"""The contracts every feature builds on: what a caller passes in and gets back."""


def test_contracts_import_only_contracts_and_the_shared_leaves() -> None:
    leaves = LAYERS[0] - {"runtime"}
    wrong = imports_where("actorsys", lambda name, target: unit(name) in CONTRACTS
                          and unit(target) not in CONTRACTS | leaves)
    assert wrong == set()


def test_the_actors_import_nothing_of_the_core() -> None:
    wrong = imports_where("actorsys", lambda name, target: unit(name) == "actors"
                          and unit(target) == "_core")
    assert wrong == set()


def test_no_import_cycle_between_modules_type_only_imports_counted() -> None:
    graph = {name: imports(name, type_checking=True) for name in MODULES}
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle_through_a_third_module() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_import_reader_sees_imports_in_functions_and_under_type_checking() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import type_only\n"
        "def f():\n"
        "    try:\n"
        "        from in_function import x\n"
        "    except ImportError:\n"
        "        import in_handler\n"
        "class C:\n"
        "    import in_class\n"
    )

    def found(type_checking: bool) -> set[str | None]:
        return {
            alias.name if isinstance(node, ast.Import) else node.module
            for node in _statements(ast.parse(source).body, type_checking=type_checking)
            for alias in node.names
        }

    assert found(False) == {"typing", "in_function", "in_handler", "in_class"}
    assert found(True) == {"typing", "type_only", "in_function", "in_handler", "in_class"}


def test_the_layer_checks_see_a_contract_or_an_actor_reaching_too_far() -> None:
    assert unit("actorsys.outcome") in CONTRACTS and unit("actorsys.snapshot._capture") not in CONTRACTS
    assert unit("actorsys.actors.exporter") == "actors" and unit("actorsys._core.disk_room") == "_core"


@pytest.mark.timeout(60)
def test_the_eval_data_flags_are_on_the_config_whatever_was_imported_first() -> None:
    code = (
        "import argparse\n"
        "from actorsys.config import EvalConfig\n"
        "parser = argparse.ArgumentParser()\n"
        "EvalConfig.add_arguments(parser)\n"
        "args = parser.parse_args(['--eval-prompt-data', 'd', 'd.jsonl', '--rm-type', 'math'])\n"
        "print(args.eval_prompt_data, args.rm_type)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['d',", "'d.jsonl']", "math"]


MOST_MODULES = 16
MOST_LINES = 400


def test_no_package_holds_over_16_modules_and_no_module_is_over_400_lines() -> None:
    # A package is read as one concept, a module top to bottom: past these, split along a
    # concept (see docs/architecture.md's layout).
    crowded = {}
    for package in PACKAGES:
        for folder in [ROOT / package, *(p for p in (ROOT / package).rglob("*") if p.is_dir())]:
            own = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
            if len(own) > MOST_MODULES:
                crowded[str(folder.relative_to(ROOT))] = len(own)
    long = {name: n for name, path in MODULES.items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MOST_LINES}
    assert not crowded, f"packages of more than {MOST_MODULES} modules: {crowded}"
    assert not long, f"modules of more than {MOST_LINES} lines: {long}"

"""Every third-party package actorsys and bridge import is declared in pyproject.toml, as a
dependency or in an extra, read from the source (every import, in functions too)."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

ENGINE_RUNTIME = {"vllm": "actorsys/fleet/vllm_worker/"}
"""Packages imported only by modules that run inside an engine's own process, whose runtime
provides them (vLLM loads ``vllm_worker``): not ours to declare."""


def third_party_imports() -> dict[str, set[str]]:
    """Top-level name -> the files that import it, for each import that is neither the
    standard library nor actorsys or bridge."""
    found: dict[str, set[str]] = {}
    for package in ("actorsys", "bridge"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ("actorsys", "bridge", "__future__"):
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    """The distributions pyproject.toml names: dependencies and every extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = [*project["dependencies"], *(s for extra in project["optional-dependencies"].values()
                                          for s in extra)]
    return {normalized(re.split(r"[\s<>=!~\[;]", spec, maxsplit=1)[0]) for spec in specs}


def undeclared() -> list[str]:
    distributions = importlib.metadata.packages_distributions()
    names = declared()
    missing = []
    for top, files in sorted(third_party_imports().items()):
        home = ENGINE_RUNTIME.get(top)
        if home is not None and all(f.startswith(home) for f in files):
            continue
        candidates = {normalized(d) for d in distributions.get(top, [top])}
        if not candidates & names:
            missing.append(f"{top} ({', '.join(sorted(files)[:2])})")
    return missing


def scan() -> dict[str, object]:
    """:func:`undeclared` and :func:`third_party_imports`, in a fresh interpreter: CPython
    3.11's ast.parse can fail ("AST constructor recursion depth mismatch") in a process where
    an earlier test caught a RecursionError."""
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_every_third_party_import_is_declared() -> None:
    assert scan()["undeclared"] == []


def test_the_scan_sees_imports_in_functions_and_maps_import_names_to_distributions() -> None:
    found = scan()["found"]
    assert isinstance(found, dict)
    assert "actorsys/snapshot/_write/safetensors.py" in found["numpy"]
    assert "yaml" in found and "pyyaml" in declared()
    assert "h11" in found and "huggingface_hub" in found and "tokenizers" in found
    assert not {"os", "json", "actorsys", "bridge"} & set(found)


if __name__ == "__main__":
    found = {top: sorted(files) for top, files in third_party_imports().items()}
    print(json.dumps({"undeclared": undeclared(), "found": found}))

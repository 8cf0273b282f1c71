"""The packages ``actorsys`` and ``actorsys.evals`` import their public names on first use
(:mod:`actorsys._lazy`): each name resolves to the object of its home module, ``dir()`` lists
them, a submodule is an attribute as before, and a name that is neither fails as usual."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import actorsys
import actorsys.evals


@pytest.mark.parametrize("package", [actorsys, actorsys.evals], ids=lambda p: p.__name__)
def test_every_public_name_is_listed_and_resolves_to_its_home(package: object) -> None:
    names = package.__all__  # type: ignore[attr-defined]
    assert set(names) <= set(dir(package))
    for name in names:
        value = getattr(package, name)
        home = importlib.import_module(value.__module__) if hasattr(value, "__module__") else None
        assert home is None or getattr(home, name, value) is value


def test_a_name_that_is_neither_public_nor_a_submodule_is_an_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        actorsys.Nope  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(ImportError):
        from actorsys.evals import Nope  # type: ignore[attr-defined]  # noqa: F401


@pytest.mark.timeout(60)
def test_a_submodule_is_an_attribute_of_the_package_without_importing_it_first() -> None:
    code = ("import actorsys, sys\nassert 'actorsys.fleet' not in sys.modules\n"
            "print(actorsys.fleet.Fleet.__name__, actorsys.evals.scoring.__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=50, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Fleet", "actorsys.evals.scoring"]

"""A package's public names, imported when first asked for (PEP 562).

A package ``__init__`` that imported every public name at once would make each of its
modules as heavy as the whole package: importing ``actorsys.evals.scoring.scorers`` (all a scoring
worker process needs) would import torch through the pipeline. So ``actorsys`` and
``actorsys.evals`` name where each public name lives and import it on first use, through a
module ``__getattr__``; ``__dir__`` lists them, and the same imports under ``TYPE_CHECKING``
let type checkers and editors see them. A name asked for that is not public but a submodule
(``import actorsys; actorsys.fleet``) imports that submodule, as the eager package did.

Example, in a package ``__init__``::

    __getattr__, __dir__ = lazy_names(__name__, {"EvalDataset": "actorsys.evals.data.dataset"})
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str, homes: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose public names live in the
    modules ``homes`` maps them to. A name is imported once, then kept in the package."""

    def __getattr__(name: str) -> Any:  # noqa: N807 - the module hook of PEP 562
        module = sys.modules[package]
        home = homes.get(name)
        if home is not None:
            value = getattr(importlib.import_module(home), name)
        elif not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}"):
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:  # noqa: N807 - the module hook of PEP 562
        return sorted({*vars(sys.modules[package]), *homes})

    return __getattr__, __dir__

"""Flags that features add to :meth:`EvalConfig.add_arguments <actorsys.EvalConfig.add_arguments>`.

The config is a contract every feature builds on, so it imports none of them: a feature whose
settings are trainer flags too (the eval datasets: ``--eval-prompt-data``, ``--eval-config``,
...) registers the function that adds them here when it is imported, and
``EvalConfig.add_arguments`` calls every registered one on its argument group. Importing
the package ``actorsys`` imports no feature (its names load on first use), so
:func:`add_registered_flags` first imports the modules named in :data:`FEATURES`: whatever was
imported before, the flags are all there.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

AddFlags = Callable[[argparse._ArgumentGroup], None]
"""Adds a feature's flags to the evaluation argument group (skipping those the parser has)."""

FEATURES = ("actorsys.evals.data.flags", "actorsys.fleet.flags")
"""The modules that register flags, by name: the config layer imports no feature."""

_REGISTERED: list[AddFlags] = []


def register_flags(add: AddFlags) -> AddFlags:
    """Have ``EvalConfig.add_arguments`` call ``add(group)``; returns ``add`` (a decorator).
    Registering one function twice adds it once."""
    if add not in _REGISTERED:
        _REGISTERED.append(add)
    return add


def add_registered_flags(group: argparse._ArgumentGroup) -> None:
    """Add every feature's flags to ``group``, in the order they registered (the modules of
    :data:`FEATURES` are imported first)."""
    for feature in FEATURES:
        importlib.import_module(feature)
    for add in _REGISTERED:
        add(group)

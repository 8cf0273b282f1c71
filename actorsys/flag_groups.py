"""Flags that features add to :meth:`EvalConfig.add_arguments <actorsys.EvalConfig.add_arguments>`.

The config is a contract every feature builds on, so it imports none of them: a feature whose
settings are trainer flags too (the eval datasets: ``--eval-prompt-data``, ``--eval-config``,
...) registers the function that adds them here when it is imported, and
``EvalConfig.add_arguments`` calls every registered one on its argument group. Importing
the package ``actorsys`` imports no feature (its names load on first use), so the package, a
layer above every feature, hands :func:`on_first_use` the function that imports them (an
explicit import the layer rule sees), and :func:`add_registered_flags` calls it first:
whatever was imported before, the flags are all there.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

AddFlags = Callable[[argparse._ArgumentGroup], None]
"""Adds a feature's flags to the evaluation argument group (skipping those the parser has)."""

_REGISTERED: list[AddFlags] = []
_IMPORTERS: list[Callable[[], None]] = []


def on_first_use(import_features: Callable[[], None]) -> None:
    """Have :func:`add_registered_flags` call ``import_features()`` (which imports the modules
    that register flags) before it adds them; the package ``actorsys`` calls this."""
    if import_features not in _IMPORTERS:
        _IMPORTERS.append(import_features)


def register_flags(add: AddFlags) -> AddFlags:
    """Have ``EvalConfig.add_arguments`` call ``add(group)``; returns ``add`` (a decorator).
    Registering one function twice adds it once."""
    if add not in _REGISTERED:
        _REGISTERED.append(add)
    return add


def add_registered_flags(group: argparse._ArgumentGroup) -> None:
    """Add every feature's flags to ``group``, in the order they registered (the
    :func:`on_first_use` functions run first, so every feature has registered)."""
    for import_features in _IMPORTERS:
        import_features()
    for add in _REGISTERED:
        add(group)

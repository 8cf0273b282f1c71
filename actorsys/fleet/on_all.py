"""The one way a fleet calls every engine at once, and what a pin fails with (defined in
:mod:`actorsys._errors`, importable here).

This sits below both :mod:`actorsys.fleet.fleet` (the Fleet) and :mod:`actorsys.fleet.pin.probe`
(the weight probe the Fleet runs), so neither needs the other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import trio

from actorsys._errors import (  # noqa: F401 - defined there, imported from here
    CheckpointRejectedError,
    EngineUnauthorizedError,
    EngineUnhealthyError,
    FleetStartError,
    PinError,
    PinViolationError,
)

T = TypeVar("T")


class Named(Protocol):
    """Anything with a ``name``: an engine, as far as error messages go."""

    name: str


E = TypeVar("E", bound=Named)


async def on_all(engines: Sequence[E], call: Callable[[E], Awaitable[T]], failure: str) -> list[T]:
    """``call`` on every engine concurrently; the results in engine order.

    If any call raised, raises the first error: a :class:`PinError` as it is, anything else
    as :class:`EngineUnhealthyError` naming the engine and ``failure``.
    """
    results: dict[int, T] = {}
    errors: list[tuple[E, Exception]] = []

    async def one(index: int, engine: E) -> None:
        try:
            results[index] = await call(engine)
        except Exception as exc:
            errors.append((engine, exc))

    async with trio.open_nursery() as nursery:
        for index, engine in enumerate(engines):
            nursery.start_soon(one, index, engine)
    if errors:
        engine, exc = errors[0]
        if isinstance(exc, PinError):
            raise exc
        raise EngineUnhealthyError(engine.name, f"{failure}: {exc!r}") from exc
    return [results[index] for index in range(len(engines))]

"""What a pin fails with (and a fleet's start), and the one way a fleet calls every engine
at once.

These sit below both :mod:`actorsys.fleet.fleet` (the Fleet) and :mod:`actorsys.fleet.pin.probe`
(the weight probe the Fleet runs), so neither needs the other's errors.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import trio

from actorsys._errors import ActorsysError

T = TypeVar("T")


class PinError(ActorsysError):
    """A pin failed. ``reason`` is the skip reason; ``engine`` the engine that failed it."""

    reason = "unhealthy"

    def __init__(self, engine: str, message: str) -> None:
        super().__init__(f"engine {engine!r}: {message}")
        self.engine = engine


class EngineUnhealthyError(PinError):
    """An engine failed its health check, refused the load, or could not report its version."""

    reason = "unhealthy"


class EngineUnauthorizedError(EngineUnhealthyError):
    """A server refused our requests for want of the right API key (HTTP 401 or 403). It is
    ``unhealthy`` with the server's message, and never waited on or retried: a key does not
    become right by asking again, so no readiness wait (``ready_timeout``) or pin retry spends
    its time on it."""

    reason = "unhealthy"


class FleetStartError(ActorsysError, RuntimeError):
    """A process of a local fleet, or an engine of a Ray fleet, did not come up; the message
    holds its log's tail."""


class PinViolationError(PinError):
    """An engine kept reporting a version other than the one it was asked to load."""

    reason = "pin_violation"

    def __init__(self, engine: str, expected: str, actual: str | None) -> None:
        super().__init__(engine, f"serves version {actual!r} after loading {expected!r}")
        self.expected = expected
        self.actual = actual


class CheckpointRejectedError(PinError):
    """An engine refused the checkpoint (or it was found unloadable before any engine was
    asked): missing, incomplete, corrupt, or not the served architecture. The engines keep
    serving the weights they had."""

    reason = "ckpt_invalid"

    def __init__(self, engine: str, path: str, message: str) -> None:
        super().__init__(engine, f"rejected checkpoint {path}: {message}")
        self.path = path


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

"""The door of one evaluation to its pinned fleet: a :class:`RequestGate` opened for the
evaluation and closed when it ends or is cut, the one way a harness that is not ours (lm-eval,
the OpenAI SDK, inspect-ai) reaches the engines.

::

    door = FleetDoor(input.fleet, checkpoint_dir, who="LmEvalTasks")
    result = await door.run(work)  # work(url, model): the harness sends to url + "/v1/..."

While ``work`` runs the gate serves; when it returns or raises, or is cancelled
(``eval_timeout``, close), the gate's listener and every connection it forwarded are closed
before ``run`` returns, so before the fleet goes back to the pool. An answer from other weights
than the pinned ones cancels ``work``; every request the harness sends carries the fleet's
``priority`` for its engine (:meth:`actorsys.Fleet.eval_priorities`), so rollouts on a shared
fleet keep their place. An answer from other weights
than the pinned ones cancels ``work`` and is raised as the gate's
:class:`~actorsys.fleet.StaleWeightsError` (``pin_violation``). What ``work`` raises is raised
as it is (never wrapped in an exception group).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from actorsys import _http
from actorsys._errors import ConfigError
from actorsys.evals._door.gate import GateStatistics, RequestGate
from actorsys.fleet.clients.completions import served_model

T = TypeVar("T")


SERVED_MODEL_FALLBACK = "default"
"""The model name sent where the fleet names none and there is no checkpoint to name it by (a
served point without ``base_checkpoint``); the engines serve one model, and take any name."""


class FleetDoor:
    """A door to ``fleet`` (its router, or its engines round-robin) for one evaluation of
    ``checkpoint_dir``; ``who`` names the eval fn in configuration errors. ``upstreams``: where
    the gate forwards to."""

    def __init__(self, fleet: Any, checkpoint_dir: str | None, *, who: str) -> None:
        self.upstreams = fleet_upstreams(fleet, who)
        self._fleet = fleet
        self.checkpoint_dir = checkpoint_dir
        self._api_key = getattr(fleet, "api_key", None)
        self.gate = RequestGate(
            self.upstreams, expected_version=getattr(fleet, "version", None), api_key=self._api_key
        )

    def statistics(self) -> GateStatistics:
        return self.gate.statistics()

    async def run(self, work: Callable[[str, str], Awaitable[T]]) -> T:
        """``await work(url, model)`` with the gate open: ``url`` is the gate's base URL,
        ``model`` the name the fleet serves (the checkpoint directory where it names none)."""
        result: T | None = None
        error: Exception | None = None
        done = False
        priorities = getattr(self._fleet, "eval_priorities", None)
        if priorities is not None:
            self.gate.priorities = await priorities()
        async with trio.open_nursery() as nursery:
            self.gate.cancel_on_failure(nursery.cancel_scope)
            url = await nursery.start(self.gate.serve)
            model = (
                await served_model_name(self.upstreams[0], self._api_key)
                or self.checkpoint_dir or SERVED_MODEL_FALLBACK
            )
            try:
                result = await work(url, model)
                done = True
            except Exception as exc:
                error = exc
            nursery.cancel_scope.cancel()
        if self.gate.failure is not None:
            raise self.gate.failure
        if error is not None:
            raise error
        if not done:
            raise RuntimeError("the door's work was cancelled without a cancellation")
        return result  # type: ignore[return-value]


def fleet_upstreams(fleet: Any, who: str) -> list[str]:
    """Where requests to ``fleet`` go: its router, or else every engine's URL."""
    if fleet is None:
        raise ConfigError("fleet", f"{who} evaluates on the pinned fleet: pass fleet= to EvalSupervisor")
    router = getattr(fleet, "router_url", None)
    urls = [router] if router else list(getattr(fleet, "urls", []))
    if not urls:
        message = f"{fleet!r} has no router_url and no engine with a url to send requests to"
        raise ConfigError("fleet", message)
    return urls


async def served_model_name(url: str, api_key: str | None) -> str | None:
    """The model name the server at ``url`` serves (``/v1/models``), or None."""
    async with _http.client(timeout=10.0, api_key=api_key) as client:
        return await served_model(client, url.rstrip("/"))

"""One engine of a :class:`~actorsys.fleet.ray.RayFleet`: the :class:`~actorsys.Engine` of one
engine actor, reached at whatever URL the actor's server has now."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

from actorsys.fleet.fleet import Engine, EngineUnhealthyError
from actorsys.fleet.local.specs import EngineSpec
from actorsys.fleet.pin.probe import ProbedEngine, ProbeUnsupportedError
from actorsys.fleet.ray._calls import await_ref

ACTOR_ANSWER_TIMEOUT = 10.0
"""Seconds an engine actor has to say where its server is. A live actor answers in
milliseconds; one that Ray is restarting, or cannot place (its node is gone and no other has
room), would hold the call until it is back: the pin says ``unhealthy`` instead."""


class RayEngine:
    """The :class:`~actorsys.Engine` of one engine actor.

    Every method first asks the actor for its server's URL (a dead or restarting actor
    raises :class:`~actorsys.fleet.EngineUnhealthyError`), then calls the server there over
    HTTP, so a server Ray restarted elsewhere is never mistaken for the one pinned before.
    Every method blocks on Ray or on the server; the caller's cancel scope bounds it.
    """

    def __init__(self, actor: Any, name: str, spec: EngineSpec, api_key: str | None = None) -> None:
        self.actor = actor
        self.name = name
        self.api_key = api_key
        self.spec = spec
        self._client: Engine | None = None
        self.url: str | None = None
        self.answer_timeout = ACTOR_ANSWER_TIMEOUT

    def __repr__(self) -> str:
        return f"RayEngine({self.name!r}, url={self.url!r})"

    async def health(self) -> None:
        await (await self._current()).health()

    async def load_weights(self, path: str, version: str) -> None:
        await (await self._current()).load_weights(path, version)

    async def weight_version(self) -> str | None:
        return await (await self._current()).weight_version()

    async def greedy_tokens(
        self, prompts: Sequence[Sequence[int]], max_tokens: int
    ) -> list[list[int]]:
        """The weight probe, asked of the server the actor runs now."""
        client = await self._current()
        if not isinstance(client, ProbedEngine):
            raise ProbeUnsupportedError(f"{type(client).__name__} has no token probe")
        return await client.greedy_tokens(prompts, max_tokens)

    async def _current(self) -> Engine:
        """The client of the server the actor runs now (a restarted actor's is new)."""
        import ray

        try:
            with trio.fail_after(self.answer_timeout):
                url = await await_ref(self.actor.url.remote())
        except ray.exceptions.RayError as exc:
            raise EngineUnhealthyError(self.name, f"its actor is not serving: {exc}") from exc
        except trio.TooSlowError as exc:
            raise EngineUnhealthyError(
                self.name, f"its actor did not answer within {self.answer_timeout} s "
                "(restarting, or no node can place it)",
            ) from exc
        if url != self.url or self._client is None:
            self._client = self.spec.make_client(url, self.name, self.api_key)
            self.url = url
        return self._client

"""Fleet: a set of inference engines pinned together to one version (the :class:`Engine`
protocol they follow: :mod:`actorsys.fleet.protocol`; the pin's steps:
:mod:`actorsys.fleet.pin.pinning`).

Pinning is the heart of trusting a score: a fleet is pinned to ``version`` only when every
engine was healthy, loaded the checkpoint, *reads back* that version, and (with the probe)
computes what the checkpoint computes. A shared fleet (``shared=True``: the trainer's own
rollout engines) is never loaded: it is pinned to the version it serves, and its engines are
judged by each other (:meth:`Fleet.pin_served`). An engine that says "success" while keeping its old
weights is caught by the read-back; one that labels the new version while serving other
weights, by the probe.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from actorsys._errors import ConfigError, ConfigTypeError
from actorsys.fleet.clients.completions import Completion, complete
from actorsys.fleet.clients.priority import eval_priorities
from actorsys.fleet.on_all import (
    CheckpointRejectedError,
    EngineUnhealthyError,
    PinError,
    PinViolationError,
    on_all,
)
from actorsys.fleet.pin.pinning import pin_engines
from actorsys.fleet.pin.probe import ReferenceSource, WeightProbe
from actorsys.fleet.pin.reference import ReferenceWorker
from actorsys.fleet.pin.served import check_still_serving, pin_served_engines
from actorsys.fleet.pin.verdict import PinVerdict
from actorsys.fleet.protocol import Engine

__all__ = [
    "CheckpointRejectedError",
    "Engine",
    "EngineUnhealthyError",
    "Fleet",
    "PinError",
    "PinViolationError",
    "on_all",
]


class Fleet:
    """Engines that serve one model together, optionally behind a router at ``router_url``.

    A fleet is a leased resource: the supervisor never pins it while an evaluation runs on it.
    An eval fn gets it as ``input.fleet``, pinned: ``version`` is the version every engine
    read back, ``base_url`` / ``urls`` say where to send requests, and ``complete`` runs
    completions with bounded concurrency and checks the version of each answer::

        answers = await input.fleet.complete(prompts, max_tokens=32, temperature=0.0)
    """

    def __init__(
        self,
        engines: Sequence[Engine],
        *,
        router_url: str | None = None,
        shared: bool = False,
        eval_priority: int | None = None,
    ) -> None:
        engines = list(engines)
        if not engines:
            raise ConfigError("Fleet(engines)", "at least one engine is required")
        for engine in engines:
            if not isinstance(engine, Engine):
                raise ConfigTypeError(
                    "Fleet(engines)",
                    f"{engine!r} is not an Engine (needs name, health, load_weights, "
                    "weight_version)",
                )
        names = [engine.name for engine in engines]
        if len(set(names)) != len(names):
            raise ConfigError("Fleet(engines)", f"engine names must be unique, got {names}")
        self.engines = engines
        self.router_url = router_url.rstrip("/") if router_url else None
        if eval_priority is not None and (
            isinstance(eval_priority, bool) or not isinstance(eval_priority, int) or eval_priority < 0
        ):
            raise ConfigError(
                "Fleet(eval_priority)",
                f"expected None or an integer >= 0 (how far behind the trainer's requests an "
                f"evaluation's requests queue), got {eval_priority!r}",
            )
        if not isinstance(shared, bool):
            raise ConfigError("Fleet(shared)", f"expected True or False, got {shared!r}")
        self._shared = shared
        self._eval_priority = eval_priority
        self.version: str | None = None
        self._probe = WeightProbe()
        self._references = ReferenceWorker()

    def __repr__(self) -> str:
        shared = ", shared=True" if self._shared else ""
        return f"Fleet({[e.name for e in self.engines]}, router_url={self.router_url!r}{shared})"

    @property
    def shared(self) -> bool:
        """Whether the trainer loads this fleet's weights itself (its rollout engines): such
        a fleet evaluates ``submit(step, served=...)`` points only, and actorsys never loads,
        pauses, resumes or relabels it (:meth:`pin_served`)."""
        return self._shared

    async def aclose(self) -> None:
        """Stop the fleet's own reference worker (the process that computes the probe's
        reference for pins not given ``references=``), if it started one. The engines are
        not touched. A later pin starts a fresh worker."""
        await self._references.aclose()

    @property
    def eval_priority(self) -> int | None:
        """How far behind the trainer's own requests an evaluation's requests queue on this
        fleet's engines (None: they are sent with no priority); see
        :mod:`actorsys.fleet.clients.priority` for what each engine is sent."""
        return self._eval_priority

    @property
    def urls(self) -> list[str]:
        """The base URLs of the engines that are reached over HTTP (those with a ``url``)."""
        return [url for url in (getattr(e, "url", None) for e in self.engines) if url]

    @property
    def api_key(self) -> str | None:
        """The key this fleet's engines answer to (their clients' ``api_key``; None: they take
        none). ``complete`` sends it unless given another. One fleet shares one key."""
        keys = {key for key in (getattr(e, "api_key", None) for e in self.engines) if key}
        if len(keys) > 1:
            raise ConfigError("Fleet(engines)", "the engines hold different API keys; one fleet "
                              "shares one key (or pass api_key= to complete)")
        return keys.pop() if keys else None

    @property
    def base_url(self) -> str | None:
        """Where one sends requests to the whole fleet: the router, or the only engine's URL.
        None for several engines without a router (use ``urls``)."""
        if self.router_url is not None:
            return self.router_url
        urls = self.urls
        return urls[0] if len(urls) == 1 and len(self.engines) == 1 else None

    async def complete(
        self,
        prompts: Sequence[str | Sequence[int]],
        *,
        max_tokens: int | Sequence[int] = 64,
        temperature: float = 0.0,
        concurrency: int = 8,
        request_timeout: float = 60.0,
        check_version: bool = True,
        model: str | None = None,
        api_key: str | None = None,
        extra: Mapping[str, Any] | None = None,
        retries: int = 0,
        keep_failures: bool = False,
    ) -> list[Completion]:
        """Complete every prompt (text, or token ids sent as they are: a rendered chat
        prompt) on this fleet; see :func:`actorsys.fleet.clients.completions.complete`.

        Requests go to the router if there is one, else round-robin over the engines;
        ``api_key`` defaults to the engines' own (:attr:`api_key`). With ``check_version``,
        an answer whose engine reports a version other than the pinned one raises
        :class:`~actorsys.fleet.clients.completions.StaleWeightsError` (the point is skipped as
        ``pin_violation``). A failed request is retried ``retries`` times on the next engine;
        with ``keep_failures`` one that still fails comes back with ``error`` set instead of
        failing the call. Runs under trio or asyncio; the caller's cancel scope bounds it.
        """
        targets = [self.router_url] if self.router_url is not None else self.urls
        if not targets:
            raise ConfigError(
                "Fleet.router_url", f"{self!r} has no HTTP engine and no router_url to send requests to"
            )
        return await complete(
            targets,
            prompts,
            expected_version=self.version if check_version else None,
            max_tokens=max_tokens,
            temperature=temperature,
            concurrency=concurrency,
            request_timeout=request_timeout,
            model=model,
            api_key=api_key if api_key is not None else self.api_key,
            extra=extra,
            retries=retries,
            keep_failures=keep_failures,
            priorities=await self.eval_priorities(),
        )

    async def eval_priorities(self) -> dict[str, int]:
        """The ``priority`` each of this fleet's URLs (its router's, or its engines') is sent
        with an evaluation's requests, from :attr:`eval_priority` translated for each engine
        (:mod:`actorsys.fleet.clients.priority`); empty where ``eval_priority`` is None.
        Blocks on one server-info request per sglang engine (bounded); the caller's cancel
        scope bounds it. Raises :class:`ConfigError` where a router fronts engines that
        would be sent different values (one request cannot carry both)."""
        if self._eval_priority is None:
            return {}
        priorities = await eval_priorities(self.engines, self._eval_priority, api_key=self.api_key)
        if self.router_url is None:
            return priorities
        values = set(priorities.values())
        if len(values) > 1:
            raise ConfigError(
                "Fleet(eval_priority)",
                f"the engines behind {self.router_url} order priorities differently "
                f"({priorities}); give each kind of engine a fleet of its own",
            )
        return {self.router_url: values.pop()} if values else {}

    async def pin(
        self,
        path: str,
        version: str,
        *,
        retries: int = 0,
        probe: bool = True,
        references: ReferenceSource | None = None,
    ) -> None:
        """Pin every engine to the checkpoint at ``path``, labelled ``version``, and wait for
        the probe's verdict: :meth:`pin_and_verify`, returning only once the answers are
        judged. Raises what it raises, or its verdict's error (then ``version`` is None).
        Blocks on the engines and the reference; the caller's cancel scope bounds it
        (``pin_timeout``), and cancelling kills the reference worker's computation."""
        failure: PinError | None = None
        try:
            async with trio.open_nursery() as nursery:
                try:
                    verdict: PinVerdict = await nursery.start(
                        self._pin_and_verify, path, version, retries, probe, references
                    )
                except PinError as exc:
                    failure = exc
            if failure is not None:
                raise failure
            await verdict.wait()
        except BaseException:
            self.version = None
            raise

    async def pin_and_verify(
        self,
        path: str,
        version: str,
        *,
        retries: int = 0,
        probe: bool = True,
        references: ReferenceSource | None = None,
        deadline: float = math.inf,
        task_status: trio.TaskStatus[PinVerdict] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Pin every engine to ``path`` labelled ``version``; start it with
        ``verdict = await nursery.start(fleet.pin_and_verify, path, version)``.

        Health-checks all engines, loads on all concurrently, then reads the version back from
        every engine; a mismatch is re-loaded up to ``retries`` times. Then the fleet is
        pinned (``version`` set) and the start returns a :class:`PinVerdict`: an evaluation
        may run on the fleet from here. With ``probe``, every engine is asked the weight
        probe (:mod:`actorsys.fleet.pin.probe`) just before, and its answers are judged in
        ``nursery`` against the snapshot's reference, computed from ``path`` by
        ``references`` (default: the fleet's own reference worker, a process) since the loads
        began, once both are ready, which settles the verdict: clean, or
        :class:`~actorsys.fleet.pin.probe.WeightsMismatchError` (the right version, other
        weights). Before the start returns it raises :class:`EngineUnhealthyError`,
        :class:`PinViolationError` (a version that never reads back) or
        :class:`CheckpointRejectedError`. Blocks on the engines; the caller's cancel scope
        bounds the pin until the start returns; the judging, which outlives it, is bounded by
        the nursery's scope and by ``deadline`` (trio time; pass the pin's own deadline).
        Cut off, the verdict is :class:`~actorsys.fleet.pin.verdict.ProbeCancelledError`; either
        cancellation kills the reference's computation. A reference that failed leaves the
        verdict clean with ``unverified`` saying why. Never raises after the start returned.
        """
        await self._pin_and_verify(
            path, version, retries, probe, references, deadline, task_status
        )

    async def pin_served(
        self,
        version: str,
        *,
        probe: bool = True,
        prompts_from: str | None = None,
        deadline: float = math.inf,
        task_status: trio.TaskStatus[PinVerdict] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Pin this fleet to the ``version`` its engines serve, loading nothing: start it with
        ``verdict = await nursery.start(fleet.pin_served, version)``.

        Health-checks every engine, then reads the versions back until every engine serves
        ``version`` (the trainer's update may be finishing) or ``deadline`` passes
        (:class:`PinViolationError`). Then the fleet is pinned and the start returns a
        :class:`PinVerdict`; with ``probe`` and two or more engines, the engines' answers to
        the probe (prompts from ``prompts_from``'s config) are judged against each other in
        ``nursery`` within ``deadline`` (:mod:`actorsys.fleet.pin.served`). The caller's
        cancel scope bounds the start; never raises after it."""
        self.version = None

        def pinned() -> None:
            self.version = version

        await pin_served_engines(
            self.engines, version, owner=repr(self), weight_probe=self._probe,
            probe=probe, prompts_from=prompts_from, pinned=pinned, deadline=deadline,
            task_status=task_status,
        )

    async def check_still_serving(self) -> None:
        """Read every engine's version again and raise :class:`PinViolationError` where it is
        no longer the pinned one (``version``): what a point on a shared fleet checks before
        it settles. Blocks on one request per engine; the caller's cancel scope bounds it."""
        if self.version is None:
            raise ConfigError("Fleet.version", f"{self!r} is not pinned")
        await check_still_serving(self.engines, self.version)

    async def _pin_and_verify(
        self,
        path: str,
        version: str,
        retries: int,
        probe: bool,
        references: ReferenceSource | None = None,
        deadline: float = math.inf,
        task_status: trio.TaskStatus[PinVerdict] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        self.version = None
        if self._shared:
            raise ConfigError(
                "Fleet(shared)", f"{self!r} is shared: the trainer loads its weights, so it is "
                "never pinned to a checkpoint (submit served points; see Fleet.pin_served)"
            )

        def pinned() -> None:
            self.version = version

        await pin_engines(
            self.engines,
            path,
            version,
            owner=repr(self),
            retries=retries,
            weight_probe=self._probe,
            probe=probe,
            references=references if references is not None else self._references,
            router_url=self.router_url,
            pinned=pinned,
            deadline=deadline,
            task_status=task_status,
        )

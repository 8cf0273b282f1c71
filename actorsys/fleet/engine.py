"""The Engine protocol and Fleet: a set of inference engines pinned together to one version.

Pinning is the heart of trusting a score: a fleet is pinned to ``version`` only when every
engine was healthy, loaded the checkpoint, *reads back* that version, and (with the probe)
computes what the checkpoint computes. An engine that says "success" while keeping its old
weights is caught by the read-back; one that labels the new version while serving other
weights, by the probe.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import httpx
import trio

from actorsys._errors import ConfigError, ConfigTypeError
from actorsys._tls import ssl_context
from actorsys.fleet.completions import Completion, complete
from actorsys.fleet.errors import (
    CheckpointRejectedError,
    EngineUnhealthyError,
    PinError,
    PinViolationError,
    on_all,
)
from actorsys.fleet.probe import (
    Answer,
    ProbedEngine,
    Reference,
    ReferenceFailedError,
    ReferenceSource,
    WeightProbe,
    judge,
)
from actorsys.fleet.reference import ReferenceWorker
from actorsys.fleet.verdict import PinVerdict, ProbeCancelledError

__all__ = [
    "CheckpointRejectedError",
    "Engine",
    "EngineUnhealthyError",
    "Fleet",
    "PinError",
    "PinViolationError",
    "on_all",
]

T = TypeVar("T")


@runtime_checkable
class Engine(Protocol):
    """One inference engine (a vLLM or sglang server, a Ray actor, the embedded engine).

    Every method may raise; the fleet turns that into a skip reason. None of them take a
    timeout: the caller's cancel scope bounds them, and cancelling must not leave the engine
    half-updated in a way a later ``load_weights`` cannot repair.
    """

    name: str

    async def health(self) -> None:
        """Return if the engine can serve; raise if not."""

    async def load_weights(self, path: str, version: str) -> None:
        """Load the checkpoint at ``path`` and label the loaded weights ``version``.

        May raise a :class:`PinError` with its own reason (e.g.
        :class:`CheckpointRejectedError`); any other exception makes the pin ``unhealthy``.
        """

    async def weight_version(self) -> str | None:
        """The version label of the weights the engine serves now."""


class Fleet:
    """Engines that serve one model together, optionally behind a router at ``router_url``.

    A fleet is a leased resource: the supervisor never pins it while an evaluation runs on it.
    An eval fn gets it as ``input.fleet``, pinned: ``version`` is the version every engine
    read back, ``base_url`` / ``urls`` say where to send requests, and ``complete`` runs
    completions with bounded concurrency and checks the version of each answer::

        answers = await input.fleet.complete(prompts, max_tokens=32, temperature=0.0)
    """

    def __init__(self, engines: Sequence[Engine], *, router_url: str | None = None) -> None:
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
        self.version: str | None = None
        self._probe = WeightProbe()
        self._references = ReferenceWorker()

    def __repr__(self) -> str:
        return f"Fleet({[e.name for e in self.engines]}, router_url={self.router_url!r})"

    async def aclose(self) -> None:
        """Stop the fleet's own reference worker (the process that computes the probe's
        reference for pins not given ``references=``), if it started one. The engines are
        not touched. A later pin starts a fresh worker."""
        await self._references.aclose()

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
        prompt) on this fleet; see :func:`actorsys.fleet.completions.complete`.

        Requests go to the router if there is one, else round-robin over the engines;
        ``api_key`` defaults to the engines' own (:attr:`api_key`). With ``check_version``,
        an answer whose engine reports a version other than the pinned one raises
        :class:`~actorsys.fleet.completions.StaleWeightsError` (the point is skipped as
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
        )

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
        every engine; a mismatch is re-loaded up to ``retries`` times. With ``probe``, every
        engine then answers the weight probe (:mod:`actorsys.fleet.probe`). Then the fleet is
        pinned (``version`` set) and the start returns a :class:`PinVerdict`: an evaluation
        may run on the fleet from here. The snapshot's reference, computed from ``path`` by
        ``references`` (default: the fleet's own reference worker, a process) since the loads
        began, is judged against the answers in ``nursery``
        once it is ready, which settles the verdict: clean, or
        :class:`~actorsys.fleet.probe.WeightsMismatchError` (the right version, other
        weights). Before the start returns it raises :class:`EngineUnhealthyError`,
        :class:`PinViolationError` (a version that never reads back) or
        :class:`CheckpointRejectedError`. Blocks on the engines; the caller's cancel scope
        bounds the pin until the start returns; the judging, which outlives it, is bounded by
        the nursery's scope and by ``deadline`` (trio time; pass the pin's own deadline).
        Cut off, the verdict is :class:`~actorsys.fleet.verdict.ProbeCancelledError`; either
        cancellation kills the reference's computation. A reference that failed leaves the
        verdict clean with ``unverified`` saying why. Never raises after the start returned.
        """
        await self._pin_and_verify(
            path, version, retries, probe, references, deadline, task_status
        )

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
        verdict = PinVerdict(version)
        source = references if references is not None else self._references
        probed = self._probe.probed(self.engines) if probe else []
        prompts = await self._probe.prompts(path) if probed else None
        reference: Reference | ReferenceFailedError | None = None
        answers: list[Answer | None] | None = None
        failure: PinError | None = None
        started = False

        async def compute(prompts: list[list[int]]) -> None:
            nonlocal reference
            reference = await self._probe.reference(source, path, prompts)

        try:
            async with trio.open_nursery() as nursery:
                if prompts is not None:
                    nursery.start_soon(compute, prompts)
                try:
                    answers = await self._load_and_read_back(
                        path, version, retries, probed if prompts is not None else [], prompts
                    )
                    if self.router_url is not None:
                        await self._probe_router()
                except PinError as exc:
                    failure = exc
                    nursery.cancel_scope.cancel()
                else:
                    self.version = version
                    started = True
                    task_status.started(verdict)
                    nursery.cancel_scope.deadline = deadline
        except BaseException:
            if started:
                verdict.settle(self._cut_off(version))
            raise
        if failure is not None:
            raise failure
        if nursery.cancel_scope.cancelled_caught:
            verdict.settle(self._cut_off(version))
        if isinstance(reference, ReferenceFailedError):
            verdict.settle(None, unverified=f"the snapshot's reference failed: {reference}")
        elif reference is not None and answers is not None:
            verdict.settle(judge(probed, answers, reference, version))
        verdict.settle(None)

    def _cut_off(self, version: str) -> ProbeCancelledError:
        return ProbeCancelledError(
            repr(self), f"the probe of version {version!r} was cut off before the snapshot's "
            "reference was ready (the pin deadline, or the pin's owner stopped)"
        )

    async def _load_and_read_back(
        self,
        path: str,
        version: str,
        retries: int,
        probed: Sequence[ProbedEngine] = (),
        prompts: list[list[int]] | None = None,
    ) -> list[Answer | None] | None:
        """Health, load, version read-back (retried on a mismatch); the ``probed`` engines'
        answers to ``prompts`` are asked at once with the read-back (both follow the load, so
        both see the loaded weights) and returned where every version reads back (None
        without ``prompts``). A version error wins over a probe error; a mismatch that is
        retried discards the answers."""
        await self._on_all(lambda engine: engine.health(), "failed its health check")
        for attempt in range(retries + 1):
            await self._on_all(
                lambda engine: engine.load_weights(path, version), "refused the load"
            )
            asked: list[list[Answer | None] | PinError | None] = [None]
            # An error raised in a nursery's body leaves it inside an ExceptionGroup: the
            # read-back's PinError is kept and raised past the nursery, as itself.
            unread: PinError | None = None
            async with trio.open_nursery() as nursery:
                if prompts is not None:
                    nursery.start_soon(self._ask, probed, prompts, asked)
                try:
                    served = await self._on_all(
                        lambda engine: engine.weight_version(),
                        "could not report its weight version",
                    )
                except PinError as exc:
                    unread = exc
                    nursery.cancel_scope.cancel()
                else:
                    wrong = [
                        (e, v) for e, v in zip(self.engines, served, strict=True) if v != version
                    ]
                    if wrong:
                        nursery.cancel_scope.cancel()
            if unread is not None:
                raise unread
            if not wrong:
                answers = asked[0]
                if isinstance(answers, PinError):
                    raise answers
                return answers
            if attempt == retries:
                engine, actual = wrong[0]
                raise PinViolationError(engine.name, version, actual)
        raise AssertionError("unreachable")

    async def _ask(
        self,
        probed: Sequence[ProbedEngine],
        prompts: list[list[int]],
        into: list[list[Answer | None] | PinError | None],
    ) -> None:
        try:
            into[0] = await self._probe.ask(probed, prompts)
        except PinError as exc:
            into[0] = exc

    async def _on_all(self, call: Callable[[Engine], Awaitable[T]], failure: str) -> list[T]:
        return await on_all(self.engines, call, failure)

    async def _probe_router(self) -> None:
        assert self.router_url is not None
        try:
            async with httpx.AsyncClient(timeout=10.0, verify=ssl_context()) as client:
                response = await client.get(f"{self.router_url}/health")
                response.raise_for_status()
        except httpx.HTTPError as exc:
            message = f"{self.router_url} is not serving: {exc!r}"
            raise EngineUnhealthyError("router", message) from exc

"""The pin of a fleet's engines to one version: health, load, the version read back (retried
on a mismatch), the router's health, then the weight probe, and the verdict once the
snapshot's reference is judged against the answers.

:meth:`~actorsys.fleet.fleet.Fleet.pin_and_verify` runs :func:`pin_engines`; the fleet keeps
its state (``version``, the probe, the reference worker) and hands it in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import httpx
import trio

from actorsys import _http
from actorsys.fleet.on_all import EngineUnhealthyError, PinError, PinViolationError, on_all
from actorsys.fleet.pin.probe import (
    Answer,
    ProbedEngine,
    Reference,
    ReferenceFailedError,
    ReferenceSource,
    WeightProbe,
    judge,
)
from actorsys.fleet.pin.verdict import PinVerdict, ProbeCancelledError, start_then_probe
from actorsys.fleet.protocol import Engine

__all__ = ["pin_engines", "read_back_wrong"]


async def pin_engines(
    engines: Sequence[Engine],
    path: str,
    version: str,
    *,
    owner: str,
    retries: int,
    weight_probe: WeightProbe,
    probe: bool,
    references: ReferenceSource,
    router_url: str | None,
    pinned: Callable[[], None],
    deadline: float = math.inf,
    task_status: trio.TaskStatus[PinVerdict] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Pin ``engines`` to ``path`` labelled ``version``; call ``pinned`` and start with the
    :class:`PinVerdict` once every engine reads the version back (and the router, if any, is
    healthy); then ask the probe and settle the verdict from its answers and ``references``'
    reference within ``deadline``. ``owner`` names the fleet in a cut-off verdict. What it
    raises and when: :meth:`~actorsys.fleet.fleet.Fleet.pin_and_verify`.

    The probe is off the pin's critical path: the evaluation may start at the read-back. The
    probe's requests are sent before the start returns control to the evaluation (so an
    engine that queues requests answers them first), and the lease keeps the fleet's weights
    where they are until the verdict, which the point awaits before it settles."""
    verdict = PinVerdict(version)
    probed = weight_probe.probed(engines) if probe else []
    reference: Reference | ReferenceFailedError | None = None
    asked: list[list[Answer | None] | PinError | None] = [None]

    async def compute(prompts: list[list[int]]) -> None:
        nonlocal reference
        reference = await weight_probe.reference(references, path, prompts)

    async def stage(nursery: trio.Nursery) -> None:
        # The prompts are read beside the load. The reference (a forward pass of the
        # snapshot on this host's CPU) is computed only after the read-back: beside the
        # load it would take the cores the engines load with, and delay the start.
        pending = weight_probe.prompts_beside(nursery, path if probed else None)
        await _load_and_read_back(engines, path, version, retries)
        if router_url is not None:
            await _probe_router(router_url)
        prompts = await pending.wait()
        if prompts is not None:
            nursery.start_soon(_ask, weight_probe, probed, prompts, asked)
            nursery.start_soon(compute, prompts)

    if not await start_then_probe(
        verdict, stage, cut_off=lambda: _cut_off(owner, version), pinned=pinned,
        deadline=deadline, task_status=task_status,
    ):
        return
    answers = asked[0]
    if isinstance(answers, PinError):
        verdict.settle(answers)
    elif isinstance(reference, ReferenceFailedError):
        verdict.settle(None, unverified=f"the snapshot's reference failed: {reference}")
    elif reference is not None and answers is not None:
        verdict.settle(judge(probed, answers, reference, version))
    verdict.settle(None)


def _cut_off(owner: str, version: str) -> ProbeCancelledError:
    return ProbeCancelledError(
        owner, f"the probe of version {version!r} was cut off before its answers were "
        "judged (the pin deadline, or the pin's owner stopped)"
    )


async def _load_and_read_back(
    engines: Sequence[Engine], path: str, version: str, retries: int
) -> None:
    """Health, load, version read-back; a mismatch is loaded again up to ``retries`` times,
    then :class:`PinViolationError`."""
    await on_all(engines, lambda engine: engine.health(), "failed its health check")
    for attempt in range(retries + 1):
        await on_all(
            engines, lambda engine: engine.load_weights(path, version), "refused the load"
        )
        wrong = await read_back_wrong(engines, version)
        if not wrong:
            return
        if attempt == retries:
            engine, actual = wrong[0]
            raise PinViolationError(engine.name, version, actual)
    raise AssertionError("unreachable")


async def read_back_wrong(
    engines: Sequence[Engine], version: str
) -> list[tuple[Engine, str | None]]:
    """Every engine's version read back; the (engine, version) of those that do not serve
    ``version``. An engine that cannot say is :class:`EngineUnhealthyError`."""
    served = await on_all(
        engines, lambda engine: engine.weight_version(), "could not report its weight version"
    )
    return [(e, v) for e, v in zip(engines, served, strict=True) if v != version]


async def _ask(
    weight_probe: WeightProbe,
    probed: Sequence[ProbedEngine],
    prompts: list[list[int]],
    into: list[list[Answer | None] | PinError | None],
) -> None:
    try:
        into[0] = await weight_probe.ask(probed, prompts)
    except PinError as exc:
        into[0] = exc


async def _probe_router(router_url: str) -> None:
    """``GET {router_url}/health`` answers 2xx; a 401 or 403 is
    :class:`~actorsys.EngineUnauthorizedError` (the router wants a key), anything else or no
    answer :class:`~actorsys.EngineUnhealthyError`."""
    try:
        async with _http.client(timeout=10.0) as client:
            response = await client.get(f"{router_url}/health")
            _http.check_authorized("router", "GET", f"{router_url}/health", response, None)
            response.raise_for_status()
    except httpx.HTTPError as exc:
        message = f"{router_url} is not serving: {exc!r}"
        raise EngineUnhealthyError("router", message) from exc

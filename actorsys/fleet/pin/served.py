"""The pin of a shared fleet: engines the trainer loads weights onto itself, so actorsys
never loads, pauses, resumes or relabels them.

A shared pin is: health; then every engine's version read back equal to the point's (read
again until the pin deadline, as the trainer may still be finishing its update; then
:class:`PinViolationError`); then the evaluation may start, while the probe is asked and
the engines are judged by each other (:mod:`actorsys.fleet.pin.probe.agreement`). With one
engine there is no one to compare with: the version alone, logged once. Before the point
settles, :func:`check_still_serving` reads every version again: a version that changed
during the evaluation (an update outside ``weight_update``) discards its scores.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import trio

from actorsys import _http
from actorsys.fleet.on_all import PinError, PinViolationError, on_all
from actorsys.fleet.pin.pinning import read_back_wrong
from actorsys.fleet.pin.probe import Answer, WeightProbe
from actorsys.fleet.pin.probe.agreement import disagreement
from actorsys.fleet.pin.verdict import PinVerdict, ProbeCancelledError, start_then_probe
from actorsys.fleet.protocol import Engine

__all__ = ["check_still_serving", "pin_served_engines"]

READ_AGAIN_FIRST = 0.05
READ_AGAIN_MOST = 1.0
"""How often a shared engine's version is read again while it does not yet serve the
point's version (the trainer's update may be finishing): waits doubling between these."""


async def pin_served_engines(
    engines: Sequence[Engine],
    version: str,
    *,
    owner: str,
    weight_probe: WeightProbe,
    probe: bool,
    prompts_from: str | None,
    pinned: Callable[[], None],
    deadline: float = math.inf,
    task_status: trio.TaskStatus[PinVerdict] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Pin the shared ``engines`` to the ``version`` they serve; start with the
    :class:`PinVerdict` once every engine reads it back, then settle the verdict from the
    engines' agreement on the probe within ``deadline`` (trio time; the read-back is bounded
    by it too). ``prompts_from`` is an HF dir whose ``config.json`` gives the probe's
    vocabulary (``EvalConfig.base_checkpoint``); without it the pin checks the version
    only, and says so once.

    Before the start returns it raises :class:`~actorsys.EngineUnhealthyError` (a failed
    health check, a version that cannot be read) or :class:`PinViolationError` (a version
    still not read back at ``deadline``). Never raises after the start returned: the
    verdict carries :class:`~actorsys.fleet.pin.probe.EnginesDisagreeError`, an engine's
    failure to answer, or :class:`ProbeCancelledError` when cut off."""
    verdict = PinVerdict(version)
    probed = weight_probe.probed(engines) if probe else []
    if probe and len(engines) == 1:
        weight_probe.note_once(
            f"the shared fleet {owner} has one engine, so there is no other engine to "
            "compare its answers with", off=True,
        )
        probed = []
    read_from = None
    if len(probed) >= 2:
        if prompts_from is None:
            weight_probe.note_once(
                f"the shared fleet {owner}'s probe needs the model's config for its prompts "
                "(set EvalConfig.base_checkpoint)"
            )
        else:
            read_from = prompts_from
    asked: list[list[Answer | None] | PinError | None] = [None]

    async def ask(prompts: list[list[int]]) -> None:
        try:
            asked[0] = await weight_probe.ask(probed, prompts)
        except PinError as exc:
            asked[0] = exc

    async def stage(nursery: trio.Nursery) -> None:
        pending = weight_probe.prompts_beside(nursery, read_from)  # beside the read-back
        await on_all(engines, lambda engine: engine.health(), "failed its health check")
        await _read_back_until(engines, version, deadline)
        prompts = await pending.wait()
        if prompts is not None:
            nursery.start_soon(ask, prompts)

    if not await start_then_probe(
        verdict, stage, cut_off=lambda: _cut_off(owner, version), pinned=pinned,
        deadline=deadline, task_status=task_status,
    ):
        return
    answers = asked[0]
    if isinstance(answers, PinError):
        verdict.settle(answers)
    elif answers is not None:
        verdict.settle(disagreement(probed, answers, version))
    verdict.settle(None)


async def _read_back_until(engines: Sequence[Engine], version: str, deadline: float) -> None:
    wrong: list[tuple[Engine, str | None]] = []
    with trio.move_on_at(deadline):
        async for _ in _http.Backoff(READ_AGAIN_FIRST, READ_AGAIN_MOST):
            wrong = await read_back_wrong(engines, version)
            if not wrong:
                return
    engine, actual = wrong[0] if wrong else (engines[0], None)
    raise PinViolationError(
        engine.name, version, actual,
        message=f"serves version {actual!r}, not {version!r}, at the pin deadline (the "
        "trainer's update of this shared engine did not reach it)",
    )


async def check_still_serving(engines: Sequence[Engine], version: str) -> None:
    """Read every engine's version again before a point on a shared fleet settles; raise
    :class:`PinViolationError` where one changed since the pin (its weights changed under
    the evaluation, whose scores are then discarded), :class:`~actorsys.EngineUnhealthyError`
    where one cannot say. Blocks on one request per engine; the caller bounds it."""
    wrong = await read_back_wrong(engines, version)
    if wrong:
        engine, actual = wrong[0]
        raise PinViolationError(
            engine.name, version, actual,
            message=f"serves version {actual!r} after an evaluation of {version!r}: its "
            "weights changed during the evaluation (an update outside weight_update)",
        )


def _cut_off(owner: str, version: str) -> ProbeCancelledError:
    return ProbeCancelledError(
        owner, f"the agreement probe of version {version!r} was cut off before the engines' "
        "answers were judged (the pin deadline, or the pin's owner stopped)"
    )

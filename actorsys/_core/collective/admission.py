"""The admission answer of a collective submit, the same on every rank.

The evaluating rank admits (or refuses) a step with its own admission and publishes the answer
(:func:`decide`); every other rank's submit of that step returns it, or raises what the
evaluating rank raised (:func:`contributor_verdict`). Nothing here blocks: the answers travel
through :class:`~actorsys._core.collective.protocol.Collective`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from actorsys._core.admission import Reservation
from actorsys._core.collective.messages import Decision
from actorsys._core.collective.protocol import Collective
from actorsys._core.submit import SubmitRequest
from actorsys._errors import ActorsysError, SubmitError


async def decide(
    collective: Collective,
    reserve: Callable[[SubmitRequest], Awaitable[Reservation | None]],
    request: SubmitRequest,
) -> Reservation | None:
    """The evaluating rank's part of a collective submit: its own admission, whose answer
    (admitted, refused, or the error it raised) every other rank's submit then returns."""
    try:
        reservation = await reserve(request)
    except ActorsysError as exc:
        collective.decided(request.step, False, f"{type(exc).__name__}: {exc}")
        raise
    except BaseException:
        collective.decided(request.step, False)
        raise
    collective.decided(request.step, reservation is not None)
    return reservation


def contributor_verdict(step: int, decision: Decision | None, eval_rank: int) -> bool:
    """Whether a contributor's submit of ``step`` is admitted, given the evaluating rank's
    ``decision`` (None: it is gone, a skip). Raises :class:`SubmitError` when the evaluating
    rank raised, or submitted another step; a refusal returns False."""
    if decision is not None and decision.admitted and not decision.error and decision.step == step:
        return True
    if decision is None or (decision.error is None and decision.step == step):
        return False
    if decision.step != step:
        raise SubmitError(
            step, f"the evaluating rank {eval_rank} submitted step {decision.step} here; "
            "every rank submits the same steps in the same order",
        )
    raise SubmitError(step, f"refused by the evaluating rank {eval_rank}: {decision.error}")

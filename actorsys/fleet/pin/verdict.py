"""The weight probe's verdict on one pin, delivered after the pin itself.

A pin starts once every engine has read the version back: from then on an evaluation may run
on the fleet. The probe's answers, and the snapshot's own answer (the reference) they are
judged against, may still be on their way; once they are in, the :class:`PinVerdict`
settles. Whoever holds the pinned fleet awaits the verdict before trusting any score taken on
it::

    async with trio.open_nursery() as nursery:
        verdict = await nursery.start(fleet.pin_and_verify, path, version)
        scores = await evaluate(fleet)
    await verdict.wait()        # raises WeightsMismatchError: discard the scores

:func:`start_then_probe` is the frame both pins (a fleet actorsys loads, a shared one) run in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from actorsys._errors import ProbeCancelledError  # noqa: F401 - defined there, imported from here
from actorsys.fleet.on_all import PinError

UNVERIFIED_KEY = "weight_probe"
"""The key of an evaluation's data that says the probe could not check its weights, and why
(:attr:`PinVerdict.unverified`)."""


class PinVerdict:
    """The verdict on one pin of one version: settled exactly once, by the task that pinned.

    ``settled`` says whether it is known; :meth:`wait` blocks until it is and raises the
    :class:`PinError` found (``WeightsMismatchError``: the engines read back the version
    but answer as other weights do; :class:`ProbeCancelledError`: never judged)."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.error: PinError | None = None
        self.unverified: str | None = None
        """Why the weights went unchecked this time though the probe was on (the snapshot's
        reference failed: the worker crashed or ran out of memory); None otherwise. The
        verdict is then clean, and whoever records the point says so in its data."""
        self._settled = trio.Event()

    def __repr__(self) -> str:
        state = "pending" if not self.settled else f"error={self.error!r}"
        if self.unverified is not None:
            state += f", unverified={self.unverified!r}"
        return f"PinVerdict({self.version!r}, {state})"

    @property
    def settled(self) -> bool:
        return self._settled.is_set()

    def settle(self, error: PinError | None, *, unverified: str | None = None) -> None:
        """Record the verdict (None: the engines serve the snapshot, as far as the probe can
        tell; with ``unverified``, the probe could not tell, and why) and wake every waiter.
        Only the first call counts."""
        if not self.settled:
            self.error = error
            self.unverified = unverified
            self._settled.set()

    def annotate(self, data: Any) -> Any:
        """``data`` (an evaluation's output data) with :data:`UNVERIFIED_KEY` saying why the
        weights went unchecked, where they did; ``data`` itself otherwise."""
        if self.unverified is None:
            return data
        note = f"not checked (the pin checked the version only): {self.unverified}"
        if not isinstance(data, dict):
            data = {"data": data}
        return {**data, UNVERIFIED_KEY: note}

    async def wait(self) -> None:
        """Block until the verdict is known; raise its error, if any. Cancellable; the pin
        that settles it is bounded by its own deadline, not by the waiter."""
        await self._settled.wait()
        if self.error is not None:
            raise self.error


async def start_then_probe(
    verdict: PinVerdict,
    stage: Callable[[trio.Nursery], Awaitable[None]],
    *,
    cut_off: Callable[[], ProbeCancelledError],
    pinned: Callable[[], None],
    deadline: float,
    task_status: trio.TaskStatus[PinVerdict],
) -> bool:
    """Run ``stage(nursery)``: what must hold before an evaluation may start (health, the
    version read back), starting the probe's tasks in ``nursery`` as it ends. A
    :class:`PinError` it raises is raised from here, before the start. Then call ``pinned``,
    start with ``verdict``, and wait for the probe's tasks until ``deadline`` (trio time).

    Returns True once they ended in time (the caller judges what they found), False where
    the deadline cut them off (the verdict then settled with ``cut_off()``). Cancelled after
    the start, it settles the verdict with ``cut_off()`` and re-raises."""
    failure: PinError | None = None
    started = False
    try:
        async with trio.open_nursery() as nursery:
            try:
                await stage(nursery)
            except PinError as exc:
                failure = exc
                nursery.cancel_scope.cancel()
            else:
                pinned()
                started = True
                task_status.started(verdict)
                nursery.cancel_scope.deadline = deadline
    except BaseException:
        if started:
            verdict.settle(cut_off())
        raise
    if failure is not None:
        raise failure
    if nursery.cancel_scope.cancelled_caught:
        verdict.settle(cut_off())
        return False
    return True

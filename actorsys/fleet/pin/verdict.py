"""The weight probe's verdict on one pin, delivered after the pin itself.

A pin returns once every engine has read the version back and answered the probe: from then
on an evaluation may run on the fleet. The snapshot's own answer (the reference,
transformers in a worker thread) may still be computing; when it is ready the engines'
answers are judged against it and the :class:`PinVerdict` settles. Whoever holds the pinned
fleet awaits the verdict before trusting any score taken on it::

    async with trio.open_nursery() as nursery:
        verdict = await nursery.start(fleet.pin_and_verify, path, version)
        scores = await evaluate(fleet)
    await verdict.wait()        # raises WeightsMismatchError: discard the scores
"""

from __future__ import annotations

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


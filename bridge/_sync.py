"""EvalBridge: EvalSupervisor embedded in a synchronous trainer.

Example::

    with EvalBridge(EvalConfig(hf_dir="/dev/shm/eval", overflow="skip"), eval_fn=MyEval()) as ev:
        for step in range(steps):
            train_one_step(model)
            if step % 100 == 0:
                ev.submit(step, model=model)   # one copy of the weights, then back to training
        ev.drain(timeout=600)
    # leaving the block closed it: bounded by close_timeout, whatever the evaluations do
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Unpack

import torch

from actorsys.config import require_seconds
from actorsys.outcome import CloseReport, DrainReport
from actorsys.snapshot import PoolStatistics
from actorsys.supervisor import SubmitArguments, SubmitRequest
from bridge._base import BridgeBase
from bridge._budgets import drains_on_exit
from bridge._update import HostUpdate


def wait_any(
    futures: list[concurrent.futures.Future[Any]], timeout: float | None
) -> None:
    """Block the calling thread until one of ``futures`` is done or ``timeout`` passes.

    Interruptible: a KeyboardInterrupt in the main thread ends the wait.
    """
    concurrent.futures.wait(
        futures, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED
    )


def remaining(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


class EvalBridge(BridgeBase):
    """An :class:`~actorsys.EvalSupervisor` on trio in a daemon thread, driven from plain
    Python.

    ``with EvalBridge(config, eval_fn=..., fleet=..., sink=...) as ev:`` starts the thread and
    returns once the supervisor is up, or raises its start-up error (e.g.
    :class:`~actorsys.ConfigError`). Leaving the block calls :meth:`close`.

    Every method is safe to call from any host thread. None of them ever waits on the trio
    thread beyond its own budget: a request is posted without blocking, and if no answer comes
    in time the bridge answers from its own record. ``handoff_timeout`` bounds how long a
    ``skip`` submit (which never waits for a slot) waits for an answer at all.
    """

    def __enter__(self) -> EvalBridge:
        rt = self._rt
        rt.trio.start()
        try:
            wait_any([rt.trio.started, rt.trio.finished], None)
        except BaseException:
            self.close(drain=False)
            raise
        rt.trio.started.result()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(drain=drains_on_exit(exc))

    def submit(
        self, step: int, *, timeout: float | None = None, **arguments: Unpack[SubmitArguments]
    ) -> bool:
        """Hand the weights of ``step`` to the pipeline; True if admitted.

        The arguments are those of :meth:`actorsys.EvalSupervisor.submit`. The weights are
        copied in this thread, after a slot is reserved and before this returns, so the
        trainer may change them right after. ``export`` runs in the supervisor's trio thread.

        Blocks on the copy, and under ``overflow="backpressure"``/``"latest"`` (or
        ``force=True``) while a slot is taken, for at most ``timeout`` seconds (None: until
        one frees). A ``skip`` submit never waits for a slot; it waits at most
        ``handoff_timeout`` for the trio thread to answer. Returns False when the point was
        not admitted: it settled at once (``busy``, ``disk_budget``) or the wait ran out (then
        nothing is recorded and the step may be submitted again). Raises what the supervisor
        raises (:class:`~actorsys.SubmitError`, :class:`~actorsys.SupervisorClosedError`...).
        An interrupt during the wait admits nothing.
        """
        rt = self._rt
        request = SubmitRequest(step, **arguments)
        bound = rt.reserve_bound(timeout, request.force)
        call = rt.post_reserve(request)
        try:
            wait_any([call.future, rt.trio.finished], bound)
        except BaseException:
            rt.give_up(call)
            raise
        return rt.copy_and_launch(call, bound, request.weights_source)

    def prepare(
        self,
        *,
        model: torch.nn.Module | None = None,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        timeout: float | None = None,
    ) -> PoolStatistics | None:
        """Optional, once before the first ``submit``: get ready for these weights, so that
        the first point costs what a later one does. Copies nothing.

        As :meth:`actorsys.EvalSupervisor.prepare`: the weights are planned (on the trio
        thread, while this thread waits), then the buffer sets are faulted in by a worker
        thread. Blocks this thread until they are, for at most ``timeout`` seconds (None: no
        bound); returns the pool's statistics, or None if the wait ran out (the preparation
        goes on in the background). An interrupt ends the wait the same way.
        """
        require_seconds("timeout", timeout, optional=True, allow_zero=True)
        rt = self._rt
        call = rt.post_prepare({"model": model, "state_dict": state_dict})
        try:
            wait_any([call.future, rt.trio.finished], timeout)
        except BaseException:
            call.abandon()
            raise
        return rt.take_prepared(call)

    @contextmanager
    def weight_update(self, timeout: float | None = None) -> Iterator[None]:
        """``with ev.weight_update():`` around each update of a shared fleet's weights; as
        :meth:`actorsys.EvalSupervisor.weight_update`. Entering blocks this thread until the
        ``served`` points admitted before it settled or were cut, for at most ``timeout``
        seconds (default ``config.shared_update_timeout``; none under ``"preempt"``) plus a
        fraction of a second; never raises for the budget. Leaving never blocks."""
        update = HostUpdate(self._rt.trio, self._rt.config, timeout)
        try:
            wait_any([update.entered.future, self._rt.trio.finished], update.wait_bound)
            update.result()
            yield
        finally:
            update.leave()

    def drain(self, timeout: float | None = None) -> DrainReport:
        """Wait until the points in flight now have settled, for at most ``timeout`` seconds
        (None: no bound). Never raises on timeout: the report says what is still pending."""
        rt = self._rt
        waiting = rt.trio.unsettled()
        call = rt.post_drain(timeout)
        wait_any([call.future, rt.trio.finished], timeout)
        return rt.drain_report(call, waiting)

    def close(self, timeout: float | None = None, *, drain: bool = True) -> CloseReport:
        """Stop admitting, let the points in flight finish (``drain``), cut off the rest, and
        stop the trio thread.

        Returns within ``timeout`` seconds (default ``config.close_timeout``) whatever the
        evaluations or the trio thread do: the supervisor closes within that budget, and the
        host joins the thread for what is left of it. Points cut off are in ``abandoned``;
        threads still running (the trio thread among them, if it is stuck) in
        ``stuck_threads``. ``drain=False`` cuts the points in flight off at once; leaving the
        ``with`` block does that when a KeyboardInterrupt or SystemExit propagates.

        Idempotent (later calls return the first report); safe in a ``finally`` while a
        KeyboardInterrupt propagates. Another interrupt during the wait ends the wait; the
        close goes on in the background.
        """
        rt = self._rt
        if rt.close_report is not None:
            return rt.close_report
        budget = rt.close_budget(timeout)
        deadline = time.monotonic() + budget
        call = rt.request_close(budget, drain)
        wait_any([call.future, rt.trio.finished], remaining(deadline))
        rt.trio.join(remaining(deadline))
        return rt.finish_close()

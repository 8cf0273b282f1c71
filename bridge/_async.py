"""AsyncEvalBridge: EvalSupervisor embedded in an asyncio trainer (``asyncio.run``, a Ray
driver).

Example::

    async def main():
        async with AsyncEvalBridge(config, eval_fn=MyEval()) as ev:
            for step in range(steps):
                await train_one_step(model)
                if step % 100 == 0:
                    await ev.submit(step, model=model)
            await ev.drain(timeout=600)

    asyncio.run(main())

The supervisor runs on trio in a thread of its own, exactly as for :class:`~bridge.EvalBridge`:
its deadlines (``eval_timeout``, ``pin_timeout``, close) keep firing while the host blocks its
own loop (a sync ``ray.get``, a CUDA sync). The host's asyncio is left as it is: no policy,
loop or signal handler is installed, and every wait is an ``asyncio.wrap_future`` of the trio
side's answer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Unpack

import torch

from actorsys.config import require_seconds
from actorsys.outcome import CloseReport, DrainReport
from actorsys.snapshot import PoolStatistics
from actorsys.supervisor import SubmitArguments, SubmitRequest
from bridge._base import BridgeBase
from bridge._budgets import drains_on_exit
from bridge._host_loop import on_host_loop
from bridge._sync import remaining
from bridge._update import HostUpdate


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class AsyncEvalBridge(BridgeBase):
    """:class:`~bridge.EvalBridge` for an asyncio host: ``async with``, awaitable methods.

    The methods take the same arguments and keep the same bounds. They must be called from
    the loop that entered the bridge.
    """

    _finished: asyncio.Future[None] | None = None

    async def _wait(self, future: concurrent.futures.Future[Any], limit: float | None) -> None:
        """Await ``future`` or the end of the trio thread, for at most ``limit`` seconds.

        Blocks only the calling task. Cancelling it ends the wait and leaves ``future`` alone.
        """
        if self._finished is None:
            self._finished = asyncio.wrap_future(self._rt.trio.finished)
            self._finished.add_done_callback(_consume)
        answer = asyncio.wrap_future(future)
        answer.add_done_callback(_consume)
        await asyncio.wait(
            [answer, self._finished], timeout=limit, return_when=asyncio.FIRST_COMPLETED
        )

    async def __aenter__(self) -> AsyncEvalBridge:
        rt = self._rt
        rt.trio.start()
        try:
            await self._wait(rt.trio.started, None)
        except BaseException:
            await self.close(drain=False)
            raise
        rt.trio.started.result()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close(drain=drains_on_exit(exc))

    async def submit(
        self,
        step: int,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a budget is the bridge's job
        **arguments: Unpack[SubmitArguments],
    ) -> bool:
        """As :meth:`bridge.EvalBridge.submit`. The wait for a slot suspends only this task;
        the weight copy runs on the loop's thread and blocks it for the copy, so the trainer
        may change the weights as soon as this returns.

        ``export`` (``async (step, path)``, or any callable returning an awaitable such as a
        Ray ``ObjectRef``) runs on this loop, not in the supervisor's thread, so it may await
        what this loop awaits; the supervisor's ``export_timeout`` and close cancel its task.
        """
        rt = self._rt
        export = arguments.get("export")
        if callable(export):
            arguments["export"] = on_host_loop(export, asyncio.get_running_loop())
        request = SubmitRequest(step, **arguments)
        bound = rt.reserve_bound(timeout, request.force)
        call = rt.post_reserve(request)
        try:
            await self._wait(call.future, bound)
        except BaseException:
            rt.give_up(call)
            raise
        return rt.copy_and_launch(call, bound, request.weights_source)

    async def prepare(
        self,
        *,
        model: torch.nn.Module | None = None,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - a budget is the bridge's job
    ) -> PoolStatistics | None:
        """As :meth:`bridge.EvalBridge.prepare`; the wait suspends only this task, and
        cancelling it leaves the preparation going on in the background."""
        require_seconds("timeout", timeout, optional=True, allow_zero=True)
        rt = self._rt
        call = rt.post_prepare({"model": model, "state_dict": state_dict})
        try:
            await self._wait(call.future, timeout)
        except BaseException:
            call.abandon()
            raise
        return rt.take_prepared(call)

    @asynccontextmanager
    async def weight_update(self, timeout: float | None = None) -> AsyncIterator[None]:  # noqa: ASYNC109
        """``async with ev.weight_update():``; as :meth:`bridge.EvalBridge.weight_update`,
        suspending only this task."""
        update = HostUpdate(self._rt.trio, self._rt.config, timeout)
        try:
            await self._wait(update.entered.future, update.wait_bound)
            update.result()
            yield
        finally:
            update.leave()

    async def drain(self, timeout: float | None = None) -> DrainReport:  # noqa: ASYNC109
        """As :meth:`bridge.EvalBridge.drain`; suspends only this task."""
        rt = self._rt
        waiting = rt.trio.unsettled()
        call = rt.post_drain(timeout)
        await self._wait(call.future, timeout)
        return rt.drain_report(call, waiting)

    async def close(
        self,
        timeout: float | None = None,  # noqa: ASYNC109 - a budget is the bridge's job
        *,
        drain: bool = True,
    ) -> CloseReport:
        """As :meth:`bridge.EvalBridge.close`: returns within ``timeout`` seconds (default
        ``config.close_timeout``), idempotent. Waiting for the trio thread to end suspends
        only this task; cancelling it leaves the close going on in the background. Leaving
        the ``async with`` block on cancellation (``asyncio.run`` on Ctrl-C) or on a
        KeyboardInterrupt cuts the points in flight off at once (``drain=False``)."""
        rt = self._rt
        if rt.close_report is not None:
            return rt.close_report
        budget = rt.close_budget(timeout)
        deadline = time.monotonic() + budget
        call = rt.request_close(budget, drain)
        await self._wait(call.future, remaining(deadline))
        if rt.trio.ever_started:
            await self._wait(rt.trio.finished, remaining(deadline))
        return rt.finish_close()

"""A contributor's side of its supervisor in a collective submit (every rank but the
evaluating one): its answer to each submit (the evaluating rank's), the copy of its local
shards, and their writes into the evaluating rank's snapshot files, one after another, in
worker threads. See :mod:`actorsys._core.collective.protocol` for the meeting.
"""

from __future__ import annotations

import functools
import logging
import math
import threading

import trio

from actorsys._core.admission import Reservation
from actorsys._core.collective.admission import contributor_verdict
from actorsys._core.collective.messages import _PeerGoneError
from actorsys._core.collective.protocol import Collective, Decision
from actorsys._core.submit import SubmitRequest
from actorsys._errors import SubmitError, SupervisorClosedError
from actorsys.actors.point import Point, Source
from actorsys.outcome import DrainReport
from actorsys.runtime import ThreadTracker, run_blocking
from actorsys.snapshot import (
    BufferLease,
    BufferPool,
    CapturedWeights,
    StatePlan,
    capture_shards,
    plan_state,
    write_pieces,
)

log = logging.getLogger("actorsys")


class Contribution:
    """A contributor's side of its supervisor: its answer to each submit (the evaluating
    rank's), and the writes of its shards, one after another, in worker threads.

    ``run`` is a task of the supervisor's nursery; ``aclose`` ends it.
    """

    def __init__(self, collective: Collective, buffers: BufferPool, tracker: ThreadTracker) -> None:
        self.collective = collective
        self.buffers = buffers
        self.tracker = tracker
        self._send, self._receive = trio.open_memory_channel[tuple[int, CapturedWeights]](math.inf)
        self._pending: dict[int, CapturedWeights] = {}
        self._captured: dict[int, CapturedWeights] = {}
        self._changed = trio.Event()
        self._scope = trio.CancelScope()
        self._limiter = trio.CapacityLimiter(1)
        self.closed = False

    async def reserve(self, request: SubmitRequest) -> Reservation | None:
        """This rank's part of a collective submit: the evaluating rank's decision and, if
        this rank holds shards, their copy. None if not admitted.

        The copy of the local shards runs in a worker thread while the decision is on its
        way, when a buffer set is free (it is given back if the point is refused), so the
        control message costs the trainer nothing beyond the copy; the caller's thread waits
        for both. Waits for the decision as long as the evaluating rank is alive (under
        backpressure it waits for a slot); a dead one is a skip after
        ``collective_timeout``. Raises :class:`SubmitError` when the evaluating rank raised,
        or submitted another step. The reservation returned holds no buffers: the copy is
        done, and ``launch`` queues its write.
        """
        if self.closed:
            raise SupervisorClosedError("the supervisor is closed; it admits nothing more")
        step, source = request.step, request.weights_source
        plan, problem = None, None
        try:
            plan = None if source is None else plan_state(source)
        except (TypeError, ValueError) as exc:
            problem = exc
        sharded = plan is not None and plan.sharding is not None
        early = None
        if sharded:
            assert plan is not None
            early = self.buffers.try_lease(plan.buffer_nbytes, pinned=plan.on_cuda)
        copied: list[CapturedWeights | BaseException] = []
        decision: Decision | None = None
        try:
            async with trio.open_nursery() as nursery:
                if early is not None:
                    assert plan is not None
                    nursery.start_soon(self._copy, plan, early, copied)
                decision = await self._decision(step)
        except BaseException:
            self._drop(copied)
            raise
        try:
            admitted = contributor_verdict(step, decision, self.collective.eval_rank)
        except BaseException:
            self._drop(copied)
            raise
        if not admitted:
            self._drop(copied)
            return None
        point = Point(step, Source.WEIGHTS)
        if problem is not None:
            await self._tell(step, f"{type(problem).__name__}: {problem}")
            raise SubmitError(step, str(problem)) from problem
        if not sharded:
            await self._tell(step, None)
            return Reservation(point, 0)
        assert plan is not None
        if not copied:
            lease = await self._lease(plan.buffer_nbytes, plan.on_cuda)
            if lease is None:
                await self._tell(step, f"no free buffer set within {self.collective.timeout:g} s")
                return Reservation(point, 0)
            await self._copy(plan, lease, copied)
        weights = copied[0]
        if isinstance(weights, BaseException):
            await self._tell(step, f"{type(weights).__name__}: {weights}")
            raise SubmitError(step, str(weights)) from weights
        self._captured[step] = weights
        return Reservation(point, plan.nbytes)

    def launch(self, reservation: Reservation, weights: CapturedWeights | None) -> bool:
        """Queue the write of this rank's shards (copied at reserve). Never blocks."""
        step = reservation.point.step
        captured = self._captured.pop(step, None)
        if captured is not None:
            self._pending[step] = captured
            self._send.send_nowait((step, captured))
        return True

    def release(self, reservation: Reservation) -> None:
        step = reservation.point.step
        captured = self._captured.pop(step, None)
        if captured is not None:
            captured.release()
        self._spawn_tell(step, "the submit on this rank was given up")

    async def _decision(self, step: int) -> Decision | None:
        try:
            return await run_blocking(
                self.collective.wait_decision, abandon_on_cancel=True,
                limiter=trio.CapacityLimiter(1), description=f"decision on step {step}",
                tracker=self.tracker,
            )
        except _PeerGoneError as exc:
            log.warning("step %s not admitted: %s", step, exc)
            return None

    async def _copy(
        self, plan: StatePlan, lease: BufferLease, copied: list[CapturedWeights | BaseException]
    ) -> None:
        """Copy this rank's shards into ``lease`` in a worker thread, waited for even when
        cancelled (the buffer is written until it returns)."""
        try:
            copied.append(await run_blocking(
                lambda: capture_shards(plan, lease), abandon_on_cancel=False,
                limiter=trio.CapacityLimiter(1), description="copy of the local shards",
                tracker=self.tracker,
            ))
        except Exception as exc:
            copied.append(exc)

    @staticmethod
    def _drop(copied: list[CapturedWeights | BaseException]) -> None:
        for weights in copied:
            if isinstance(weights, CapturedWeights):
                weights.release()

    async def run(self) -> None:
        with self._scope:
            async for step, weights in self._receive:
                try:
                    await run_blocking(
                        functools.partial(self._write, step, weights), abandon_on_cancel=True,
                        limiter=self._limiter, description=f"shards of step {step}",
                        tracker=self.tracker,
                    )
                finally:
                    weights.release()
                    self._pending.pop(step, None)
                    self._changed.set()
                    self._changed = trio.Event()

    async def drain(self, timeout: float | None) -> DrainReport:  # noqa: ASYNC109 - a budget
        """Wait until the shards handed over so far are written, for at most ``timeout``."""
        waiting = sorted(self._pending)
        await trio.lowlevel.checkpoint()
        with trio.move_on_after(math.inf if timeout is None else timeout):
            while any(step in self._pending for step in waiting):
                await self._changed.wait()
        pending = [s for s in waiting if s in self._pending]
        return DrainReport(settled=[s for s in waiting if s not in pending], pending=pending)

    async def aclose(self, budget: float) -> list[int]:
        """Stop admitting, let the queued writes finish within ``budget``, abandon the rest
        (their threads stop at their next chunk). Returns the steps abandoned."""
        self.closed = True
        self._send.close()
        report = await self.drain(budget)
        self._scope.cancel()
        for weights in list(self._pending.values()):
            weights.release()
        return report.pending

    def _write(self, step: int, weights: CapturedWeights) -> None:
        c = self.collective
        try:
            with weights.reading():
                ready = c.wait_ready(step, weights.check_live)
                if ready is None:
                    return
                directory, starts = ready
                write_pieces(weights, directory, starts, evaluating=False, check=weights.check_live)
            c.contributed(step, None)
        except Exception as exc:
            log.warning("the shards of step %d were not written: %r", step, exc)
            try:
                c.contributed(step, f"{type(exc).__name__}: {exc}")
            except Exception:
                log.warning("could not reach the job's store", exc_info=True)

    async def _lease(self, nbytes: int, pinned: bool) -> BufferLease | None:
        with trio.move_on_after(self.collective.timeout):
            while True:
                lease = self.buffers.try_lease(nbytes, pinned=pinned)
                if lease is not None:
                    return lease
                await self._changed.wait()
        return None

    async def _tell(self, step: int, error: str | None) -> None:
        await run_blocking(
            lambda: self.collective.contributed(step, error), abandon_on_cancel=True,
            limiter=trio.CapacityLimiter(1), description=f"answer on step {step}", tracker=self.tracker,
        )

    def _spawn_tell(self, step: int, error: str) -> None:
        threading.Thread(
            target=self.collective.contributed, args=(step, error), name="actorsys collective", daemon=True
        ).start()

"""EvalSupervisor: the trio-native front of the pipeline.

Example::

    async with EvalSupervisor.open(config, eval_fn=MyEval(), fleet=fleet) as sup:
        for step in range(steps):
            train_one_step()
            if step % 100 == 0:
                await sup.submit(step, model=model)   # one CPU copy, then back to training
        report = await sup.drain(timeout=600)

Inside, four supervised actors (Exporter -> FleetPinner -> EvalRunner -> Retirer, built in
:mod:`actorsys._core.wiring`) move each point forward, each owning what it holds; admission is
:mod:`actorsys._core.admission`, drain and close :mod:`actorsys._core.close`. The rules they keep are
those ``docs/architecture.md`` draws.
Nothing an evaluation does is raised here: it settles as an :class:`~actorsys.Outcome`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Unpack

import torch
import trio

from actorsys._core import close as _close
from actorsys._core.admission import Reservation
from actorsys._core.collective.admission import decide
from actorsys._core.collective.contribution import Contribution
from actorsys._core.collective.protocol import Collective
from actorsys._core.decisions import Decisions
from actorsys._core.resume import Resumption, open_journal
from actorsys._core.staging_claim import StagingClaim, open_staging
from actorsys._core.submit import SubmitArguments, SubmitRequest
from actorsys._core.supervisor_start import join_collective, release_claim, run_actors, warm_up
from actorsys._core.wiring import Wiring, check_collaborators, wire
from actorsys._errors import ConfigError, SupervisorClosedError
from actorsys.config import EvalConfig, require_seconds
from actorsys.contracts import EvalFn
from actorsys.fleet import Fleet
from actorsys.outcome import CloseReport, DrainReport, SupervisorStatistics
from actorsys.runtime import ThreadTracker, run_blocking
from actorsys.sinks import Sink
from actorsys.snapshot import (
    CapturedWeights,
    PoolStatistics,
    caller_streams,
    capture,
    prepare_weights,
)

log = logging.getLogger("actorsys")

NOT_STARTED = SupervisorStatistics(
    in_flight=0, settled=0, ok=0, skipped_by_reason={}, restarts=0, gave_up=False, closed=False
)

__all__ = ["EvalSupervisor", "Reservation", "SubmitRequest"]

_NOT_EVALUATING_RANK = (
    "served points and weight_update belong to the evaluating rank (EvalConfig.eval_rank), "
    "the process that drives the rollout engines; call them there only"
)


class EvalSupervisor(Decisions):
    """Owns the actors and the admission of points. Build it with ``open``."""

    def __init__(
        self,
        config: EvalConfig,
        *,
        eval_fn: EvalFn,
        fleet: Fleet | Sequence[Fleet] | None = None,
        sink: Sink | Sequence[Sink] | None = None,
    ) -> None:
        self._fleets, self.sink = check_collaborators(config, eval_fn, fleet, sink)
        self.config = config
        self.eval_fn = eval_fn
        self._wiring: Wiring | None = None
        self._closer = _close.Closer()
        self._collective: Collective | None = None
        self._contribution: Contribution | None = None
        self._warming = trio.CancelScope()

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        config: EvalConfig,
        *,
        eval_fn: EvalFn,
        fleet: Fleet | Sequence[Fleet] | None = None,
        sink: Sink | Sequence[Sink] | None = None,
    ) -> AsyncIterator[EvalSupervisor]:
        """Start the supervisor and its actors; leaving the block calls ``aclose()``.

        Raises :class:`~actorsys.ConfigError` before starting anything if the config, eval fn,
        fleet, sink or staging dir is unusable, and :class:`~actorsys.StagingInUseError` (a
        ``ConfigError``, naming the holder's pid) if another live supervisor holds ``hf_dir``.
        At start, in a worker thread, the staging dir is claimed (an OS lock, released when
        the block is left) and the tmp directories an earlier crashed run left there are
        removed (:mod:`actorsys._core.staging_claim`); then the journal is read, and the points
        a crashed run left unsettled are evaluated again (``resume``) or retired
        (:mod:`actorsys._core.resume`).

        In a ``torch.distributed`` job of several ranks the open is collective (see
        :mod:`actorsys._core.collective.protocol`): it returns once every rank opened, and raises
        :class:`~actorsys.ConfigError` on every rank if one of them does not see ``hf_dir``.
        Only the evaluating rank claims the staging dir; the other ranks write their shards
        into it without taking its lock or sweeping it.
        """
        sup = cls(config, eval_fn=eval_fn, fleet=fleet, sink=sink)
        tracker = ThreadTracker()
        sup._collective, sup.sink = await join_collective(config, sup.sink, tracker)
        claim = None
        try:
            if config.staging_dir is not None:
                claim = await open_staging(config.staging_dir, tracker, lock=not sup._contributing)
            resumption = Resumption(None)
            if not sup._contributing:
                resumption = await open_journal(
                    config, None if claim is None else claim.path, tracker,
                    collective=sup._collective is not None,
                )
            async with sup._run(claim, tracker, resumption):
                yield sup
        finally:
            if sup._collective is not None and sup._wiring is None:
                sup._collective.close()
            if claim is not None:
                await release_claim(claim, tracker)

    @property
    def _contributing(self) -> bool:
        """This rank only hands over its shards: another rank's supervisor evaluates."""
        return self._collective is not None and not self._collective.evaluating

    def _run(
        self, claim: StagingClaim | None, tracker: ThreadTracker, resumption: Resumption
    ) -> AbstractAsyncContextManager[None]:
        staging_dir = None if claim is None else claim.path
        wiring = self._wiring = wire(
            self.config, eval_fn=self.eval_fn, sink=self.sink, fleets=self._fleets,
            on_crash=self._on_crash, on_give_up=self._on_give_up, staging_dir=staging_dir,
            tracker=tracker, journal=resumption.journal,
        )
        wiring.admission.resume(resumption.points)
        if self._contributing:
            assert self._collective is not None
            self._contribution = Contribution(self._collective, wiring.buffers, wiring.tracker)
            return run_actors(wiring, self._contribution.run, self.aclose)
        return run_actors(wiring, partial(warm_up, self.eval_fn, self._warming), self.aclose)

    def _running(self) -> Wiring:
        if self._wiring is None:
            raise SupervisorClosedError("the supervisor is not running; use EvalSupervisor.open")
        return self._wiring

    async def prepare(
        self,
        *,
        model: torch.nn.Module | None = None,
        state_dict: Mapping[str, torch.Tensor] | None = None,
    ) -> PoolStatistics:
        """Optional, once before the first point: get ready for ``submit`` of these weights, so
        that the first point costs the trainer what a later one does. Copies nothing.

        Plans the weights in this thread (cheap), then, in a worker thread: looks up whether
        transformers converts the model's weights on save, and allocates and faults in
        ``max_in_flight`` buffer sets of the right size. Blocks this task until that is done
        (about one copy of the weights into fresh memory per set), never the trio thread.
        Cancelling returns at once; the sets being prepared still join the pool. Returns the
        pool's statistics. Raises :class:`~actorsys.ConfigError` naming a bad argument.
        """
        wiring = self._running()
        return await prepare_weights(
            wiring.buffers, wiring.tracker, model=model, state_dict=state_dict
        )

    # -- admission -------------------------------------------------------------------------

    async def submit(self, step: int, **arguments: Unpack[SubmitArguments]) -> bool:
        """Hand the weights of ``step`` to the pipeline; True if admitted.

        The arguments (``SubmitArguments``, all keyword-only): ``model=None, state_dict=None,
        export=None, checkpoint_dir=None, served=None, require_marker=None, force=False``.
        Exactly one source: ``model`` / ``state_dict`` (copied to CPU before this returns, so
        the trainer may change them right after; the copy runs in a worker thread, on the
        caller's current CUDA streams, so the actors and evaluations run on meanwhile),
        ``export`` (``async (step, path)`` that writes the checkpoint into ``path``),
        ``checkpoint_dir`` (an existing checkpoint, never deleted), or ``served`` (``True``,
        or the version string the trainer labels its engines with: the weights the shared
        fleets serve now; nothing is copied, exported or retired, and the point goes only to
        a shared fleet). With ``save_hf`` set and no ``hf_dir``, no source evaluates the
        trainer's own saved checkpoint of ``step``. A source no fleet takes (``served`` with
        no shared fleet, another one when every fleet is shared) raises
        :class:`~actorsys.ConfigError` and changes nothing.

        Always a checkpoint, so a trio trainer that only awaits ``submit`` lets the actors
        run. Blocks only under ``overflow="backpressure"`` (or ``force=True``) while
        ``max_in_flight`` points are in flight, until one settles; cancelling that wait
        admits nothing. Returns False when the point settled at once instead (``busy``,
        ``disk_budget``): its outcome is in the sink by then. Raises a
        :class:`~actorsys.SubmitError` for malformed calls and
        :class:`~actorsys.SupervisorClosedError` / :class:`~actorsys.SupervisorGaveUpError`
        once the supervisor admits nothing; neither changes any state.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        request = SubmitRequest(step, **arguments)
        reservation = await self.reserve(request)
        if reservation is None:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return False
        weights = None
        if request.weights_source is not None and reservation.buffers is not None:
            try:
                weights = await self._copy(request, reservation)
            except BaseException:
                self.release(reservation)
                raise
        admitted = self.launch(reservation, weights)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return admitted

    async def _copy(self, request: SubmitRequest, reservation: Reservation) -> CapturedWeights:
        """Copy the weights in a worker thread, so the actors run on while it copies: trio
        waits for it also when cancelled (the trainer may change the weights once ``submit``
        returns, and the buffers are written until the thread ends). The thread copies on the
        caller's current CUDA streams (none on CPU), as a copy in the caller's thread would.
        Cancelled before the thread starts, nothing was copied."""
        source, buffers, plan = request.weights_source, reservation.buffers, reservation.plan
        assert source is not None and buffers is not None
        streams = caller_streams(plan) if plan is not None else None
        return await run_blocking(
            lambda: capture(source, buffers=buffers, plan=plan, streams=streams),
            abandon_on_cancel=False, limiter=trio.CapacityLimiter(1),
            description=f"copy of the weights of step {request.step}",
            tracker=self._running().tracker,
        )

    async def reserve(self, request: SubmitRequest) -> Reservation | None:
        """The admission half of ``submit``: validate, wait for a slot, check the disk, lease
        a buffer set for the weights.

        Returns a :class:`Reservation` to ``launch`` once the weights are copied with
        ``capture(request.weights_source, buffers=reservation.buffers)`` (or to ``release``),
        or None if the point settled at once. For hosts that copy the weights in their own
        thread (the bridge); ``submit`` is reserve + copy (in a worker thread) + launch. A reservation without
        ``buffers`` needs no copy (a rank of a collective submit that holds no shards).
        """
        admission = self._running().admission
        if request.arguments.get("served") not in (None, False):
            # A served point is the evaluating rank's own: the other ranks hold no weights of it.
            if self._contribution is not None:
                raise ConfigError("submit(served)", _NOT_EVALUATING_RANK)
            return await admission.reserve(request)
        if self._contribution is not None:
            return await self._contribution.reserve(request)
        if self._collective is not None:
            return await decide(self._collective, admission.reserve, request)
        return await admission.reserve(request)

    def launch(self, reservation: Reservation, weights: CapturedWeights | None) -> bool:
        """Start a reserved point down the pipeline with its copied ``weights``.

        If the supervisor closed or gave up since the reservation, the point settles
        ``closed`` / ``crashed`` instead and this returns False.
        """
        if self._contribution is not None:
            return self._contribution.launch(reservation, weights)
        if self._collective is not None and weights is not None and weights.sharding is not None:
            weights.handover = self._collective.handover(reservation.point.step)
        return self._running().admission.launch(reservation, weights)

    def release(self, reservation: Reservation) -> None:
        """Give back a reservation that will not be launched; the step may be submitted again."""
        if self._contribution is not None:
            return self._contribution.release(reservation)
        self._running().admission.release(reservation)
        if self._collective is not None:
            self._collective.settled(reservation.point.step)

    def weight_update(self, timeout: float | None = None) -> AbstractAsyncContextManager[None]:  # noqa: ASYNC109 - a budget
        """``async with sup.weight_update():`` around each update of a shared fleet's weights
        (the trainer's NCCL broadcast, CUDA IPC or disk reload, and its version label).

        On entry it waits until every ``served`` point admitted before it has settled
        (queued, pinning or evaluating), for at most ``timeout`` seconds (default
        ``config.shared_update_timeout``; no wait under ``shared_update="preempt"``); what
        has not settled by then is cut: ``preempted`` if it was evaluating (its scores are
        discarded), ``superseded`` if not. Entry never raises for the budget and returns
        within it. Inside the block no evaluation starts on a shared fleet; leaving it lets
        them start again. Cancelling the entry's wait cuts nothing and leaves at once.
        Counted in ``statistics().weight_update_waits`` and ``.weight_update_wait_seconds``.
        Raises :class:`~actorsys.ConfigError` on a rank that is not the evaluating one.
        """
        if self._contributing:
            raise ConfigError("weight_update", _NOT_EVALUATING_RANK)
        config = self.config
        if config.shared_update == "preempt":
            budget = 0.0
        elif timeout is None:
            budget = config.shared_update_timeout
        else:
            budget = require_seconds("weight_update(timeout)", timeout, allow_zero=True)
        return self._running().gate.update(budget)

    def note_step(self, step: int) -> None:
        """Tell the supervisor the trainer's current step (for ``eval/lag_steps``)."""
        if self._wiring is not None:
            self._wiring.retirer.note_step(step)

    # -- supervision -------------------------------------------------------------------------

    def _on_crash(self, actor: str, exc: Exception) -> None:
        log.error("actor %s crashed", actor, exc_info=exc)
        self._running().crashed(actor, exc)

    def _on_give_up(self, exc: Exception) -> None:
        log.error("too many actor crashes; the supervisor stops", exc_info=exc)
        self._running().give_up(exc)

    # -- drain and close ---------------------------------------------------------------------

    async def drain(self, timeout: float | None = None) -> DrainReport:  # noqa: ASYNC109 - a budget
        """Wait until the points now in flight have settled, for at most ``timeout`` seconds
        (None: no bound). Always a checkpoint. Never raises on timeout: the report says what
        is still pending."""
        if self._wiring is None:
            await trio.lowlevel.checkpoint()
            return DrainReport(settled=[], pending=[])
        if self._contribution is not None:
            return await self._contribution.drain(timeout)
        return await _close.drain(self._wiring, timeout)

    async def aclose(
        self, timeout: float | None = None, *, drain: bool = True  # noqa: ASYNC109 - a budget
    ) -> CloseReport:
        """Stop admitting, drain within the budget, cut off the rest, stop the actors.

        Always returns within ``timeout`` seconds (default ``close_timeout``), also when an
        evaluation hangs in trio, in a thread or on an engine: points still in flight settle
        ``closed`` (listed in ``abandoned``) and their snapshots are retired; threads that
        could not be stopped are listed in ``stuck_threads``. With ``drain=False`` the points
        in flight are cut off at once (for an interrupted host), and the budget only bounds
        stopping the actors. Shielded from outer cancellation, so it runs to completion within
        its own budget. Idempotent.
        """
        self._warming.cancel()
        if self._wiring is None:
            await trio.lowlevel.checkpoint()  # nothing to close, and still a checkpoint
            return CloseReport(clean=True, abandoned=[], stuck_threads=[])
        budget = self.config.close_timeout if timeout is None else timeout
        if self._contribution is not None:
            return await self._closer.close_contributing(
                self._wiring, self.eval_fn, self._contribution, budget, drain
            )
        report = await self._closer.close_once(self._wiring, self.eval_fn, budget, drain)
        if self._collective is not None:
            self._collective.close()
        return report

    # -- introspection -----------------------------------------------------------------------

    def statistics(self) -> SupervisorStatistics:
        """Points in flight, settled, skipped by reason, actor restarts."""
        return NOT_STARTED if self._wiring is None else self._wiring.statistics()

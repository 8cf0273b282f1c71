"""EvalSupervisor: the trio-native front of the pipeline.

Example::

    async with EvalSupervisor.open(config, eval_fn=MyEval(), fleet=fleet) as sup:
        for step in range(steps):
            train_one_step()
            if step % 100 == 0:
                await sup.submit(step, model=model)   # one CPU copy, then back to training
        report = await sup.drain(timeout=600)

Inside, four supervised actors (Exporter -> FleetPinner -> EvalRunner -> Retirer) move each
point along trio memory channels; see ``../DESIGN.md``. Nothing an evaluation does is raised
here: it settles as an :class:`~actorsys.Outcome`.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import torch
import trio

from actorsys import staging
from actorsys._errors import (
    ConfigError,
    DuplicateStepError,
    SubmitError,
    SupervisorClosedError,
    SupervisorGaveUpError,
)
from actorsys._pipeline import Pipeline
from actorsys._point import ExportFn, Point, Source
from actorsys.actors.exporter import run_exporter
from actorsys.actors.pinner import run_pinner
from actorsys.actors.retirer import run_retirer
from actorsys.actors.runner import EvalInvoker, run_runner
from actorsys.config import EvalConfig
from actorsys.contracts import RUNTIMES, CheckpointEvalFn
from actorsys.fleet import Fleet
from actorsys.outcome import CloseReport, DrainReport, SupervisorStatistics
from actorsys.runtime import ActorSupervisor, ChildSpec, Restart, run_blocking
from actorsys.sinks import MemorySink, Sink
from actorsys.snapshot import (
    BufferLease,
    CapturedWeights,
    PoolStatistics,
    StatePlan,
    capture,
    plan_state,
    prepare_weights,
)

log = logging.getLogger("actorsys")

CLOSE_RESERVE_FRACTION = 0.1
CLOSE_RESERVE_MAX = 1.0
DISK_HEADROOM_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Reservation:
    """A slot held for a point between admission and launch (the weight copy happens in
    between, in whichever thread the caller is on, into ``buffers``: a set leased from the
    supervisor's pool; pass it to ``capture``)."""

    point: Point
    nbytes: int
    buffers: BufferLease | None = None


class EvalSupervisor:
    """Owns the actors, the channels and the admission of points. Build it with ``open``."""

    def __init__(
        self,
        config: EvalConfig,
        *,
        eval_fn: Any,
        fleet: Fleet | Sequence[Fleet] | None = None,
        sink: Sink | None = None,
    ) -> None:
        if not isinstance(config, EvalConfig):
            raise ConfigError("config", f"expected an EvalConfig, got {type(config).__name__}")
        _check_eval_fn(eval_fn)
        fleets = _fleets(fleet)
        if sink is not None and not callable(getattr(sink, "record", None)):
            raise ConfigError("sink", f"{sink!r} has no record(outcome) method")
        self.config = config
        self.eval_fn = eval_fn
        self.sink: Sink = sink if sink is not None else MemorySink()
        self._fleets = fleets
        self._pipeline: Pipeline | None = None
        self._actors: ActorSupervisor | None = None
        self._invoker: EvalInvoker | None = None
        self._steps: set[int] = set()
        self._reserved = 0
        self._closing = False
        self._close_report: CloseReport | None = None
        self._close_done = trio.Event()
        self._gave_up: Exception | None = None

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        config: EvalConfig,
        *,
        eval_fn: Any,
        fleet: Fleet | Sequence[Fleet] | None = None,
        sink: Sink | None = None,
    ) -> AsyncIterator[EvalSupervisor]:
        """Start the supervisor and its actors; leaving the block calls ``aclose()``.

        Raises :class:`~actorsys.ConfigError` before starting anything if the config, eval fn,
        fleet, sink or staging dir is unusable. At start, tmp directories an earlier crashed
        run left in ``hf_dir`` are removed.
        """
        sup = cls(config, eval_fn=eval_fn, fleet=fleet, sink=sink)
        actors = sup._prepare()
        body_error: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(actors.run)
                try:
                    yield sup
                except BaseException as exc:
                    body_error = exc
                    raise
                finally:
                    await sup.aclose()
        except BaseExceptionGroup as group:
            # The actors never raise out of the nursery, so a lone error here is the caller's
            # own, from the body of the `async with`: give it back to them as they raised it.
            if body_error is not None and group.exceptions == (body_error,):
                raise body_error from None
            raise

    def _prepare(self) -> ActorSupervisor:
        staging_dir = self.config.staging_dir
        if staging_dir is not None:
            staging_dir = staging.prepare_staging_dir(staging_dir)
            for path in staging.sweep(staging_dir):
                log.info("removed %s left by an earlier run", path)
        pipeline = Pipeline(self.config, self.sink, self._fleets, staging_dir)
        invoker = EvalInvoker(self.eval_fn, pipeline)
        export_limiter = trio.CapacityLimiter(self.config.max_in_flight)

        async def exporter() -> None:
            await run_exporter(
                pipeline, pipeline.export_recv.clone(), pipeline.pin_send.clone(), export_limiter
            )

        async def pinner() -> None:
            await run_pinner(pipeline, pipeline.pin_recv.clone(), pipeline.eval_send.clone())

        async def runner() -> None:
            await run_runner(pipeline, pipeline.eval_recv.clone(), pipeline.retire_send.clone(), invoker)

        async def retirer() -> None:
            await run_retirer(pipeline, pipeline.retire_recv.clone())

        specs = [
            ChildSpec("exporter", exporter, Restart.TRANSIENT, 1.0, pipeline.export_send.close),
            ChildSpec("pinner", pinner, Restart.TRANSIENT, 1.0, pipeline.pin_send.close),
            ChildSpec("runner", runner, Restart.TRANSIENT, 1.0, pipeline.eval_send.close),
            ChildSpec("retirer", retirer, Restart.TRANSIENT, 1.0, pipeline.retire_send.close),
        ]
        actors = ActorSupervisor(
            specs,
            max_restarts=self.config.max_restarts,
            restart_period=self.config.restart_period,
            on_crash=self._on_crash,
            on_give_up=self._on_give_up,
        )
        self._pipeline, self._actors, self._invoker = pipeline, actors, invoker
        return actors

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
        pipeline = self._running_pipeline()
        return await prepare_weights(
            pipeline.buffers, pipeline.tracker, model=model, state_dict=state_dict
        )

    # -- admission -------------------------------------------------------------------------

    async def submit(
        self,
        step: int,
        *,
        model: torch.nn.Module | None = None,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        export: ExportFn | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        require_marker: bool | None = None,
        force: bool = False,
    ) -> bool:
        """Hand the weights of ``step`` to the pipeline; True if admitted.

        Exactly one source: ``model`` / ``state_dict`` (copied to CPU before this returns, so
        the trainer may change them right after), ``export`` (``async (step, path)`` that
        writes the checkpoint into ``path``), or ``checkpoint_dir`` (an existing checkpoint,
        never deleted). With ``save_hf`` set and no ``hf_dir``, no source evaluates the
        trainer's own saved checkpoint of ``step``.

        Blocks only under ``overflow="backpressure"`` (or ``force=True``) while
        ``max_in_flight`` points are in flight, until one settles; cancelling that wait
        admits nothing. Returns False when the point settled at once instead (``busy``,
        ``disk_budget``). Raises a :class:`~actorsys.SubmitError` for malformed calls and
        :class:`~actorsys.SupervisorClosedError` / :class:`~actorsys.SupervisorGaveUpError`
        once the supervisor admits nothing; neither changes any state.
        """
        reservation = await self.reserve(
            step,
            model=model,
            state_dict=state_dict,
            export=export,
            checkpoint_dir=checkpoint_dir,
            require_marker=require_marker,
            force=force,
        )
        if reservation is None:
            return False
        weights_source = model if model is not None else state_dict
        weights = None
        if weights_source is not None:
            try:
                weights = capture(weights_source, buffers=reservation.buffers)
            except BaseException:
                self.release(reservation)
                raise
        return self.launch(reservation, weights)

    async def reserve(
        self,
        step: int,
        *,
        model: torch.nn.Module | None = None,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        export: ExportFn | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        require_marker: bool | None = None,
        force: bool = False,
    ) -> Reservation | None:
        """The admission half of ``submit``: validate, wait for a slot, check the disk, lease
        a buffer set for the weights.

        Returns a :class:`Reservation` to ``launch`` once the weights are copied with
        ``capture(source, buffers=reservation.buffers)`` (or to ``release``), or None if the
        point settled at once. For hosts that copy the weights in their own thread (the
        bridge); ``submit`` is reserve + copy + launch.
        """
        point, plan = self._check_submit(
            step, model, state_dict, export, checkpoint_dir, require_marker, force
        )
        nbytes = 0 if plan is None else plan.nbytes
        pipeline = self._running_pipeline()
        self._steps.add(step)
        pipeline.note_step(step)
        try:
            admitted = await self._wait_for_slot(point)
        except BaseException:
            self._steps.discard(step)
            raise
        if not admitted:
            return None
        if nbytes and not self._disk_has_room(nbytes):
            self._reserved -= 1
            pipeline.fail(point, "disk_budget", f"{nbytes} bytes do not fit on {pipeline.staging_dir}")
            pipeline.settle(point)
            return None
        if plan is None:
            return Reservation(point, nbytes)
        buffers = await self._lease_buffers(point, plan)
        return None if buffers is None else Reservation(point, nbytes, buffers)

    def launch(self, reservation: Reservation, weights: CapturedWeights | None) -> bool:
        """Start a reserved point down the pipeline with its copied ``weights``.

        If the supervisor closed or gave up since the reservation, the point settles
        ``closed`` / ``crashed`` instead and this returns False.
        """
        pipeline = self._pipeline
        if pipeline is None:
            raise SupervisorClosedError("the supervisor is not running; use EvalSupervisor.open")
        self._reserved -= 1
        point = reservation.point
        if self._closing or self._gave_up is not None:
            if weights is not None:
                weights.release()
            elif reservation.buffers is not None:
                reservation.buffers.give_back()
            pipeline.fail(point, "closed" if self._gave_up is None else "crashed")
            pipeline.settle(point)
            return False
        point.weights = weights
        pipeline.admit(point)
        log.info("step %d admitted (%s)", point.step, point.source.value)
        return True

    def release(self, reservation: Reservation) -> None:
        """Give back a reservation that will not be launched; the step may be submitted again."""
        self._reserved -= 1
        self._steps.discard(reservation.point.step)
        if reservation.buffers is not None:
            reservation.buffers.give_back()
        if self._pipeline is not None:
            self._pipeline.wake()

    def note_step(self, step: int) -> None:
        """Tell the supervisor the trainer's current step (for ``eval/lag_steps``)."""
        if self._pipeline is not None:
            self._pipeline.note_step(step)

    def _check_submit(
        self,
        step: int,
        model: torch.nn.Module | None,
        state_dict: Mapping[str, torch.Tensor] | None,
        export: ExportFn | None,
        checkpoint_dir: str | os.PathLike[str] | None,
        require_marker: bool | None,
        force: bool,
    ) -> tuple[Point, StatePlan | None]:
        self._running_pipeline()
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise SubmitError(step, "step must be an integer >= 0")
        if step in self._steps:
            raise DuplicateStepError(step, "this step was already submitted; each step is evaluated once")
        given = {
            name: value
            for name, value in (
                ("model", model), ("state_dict", state_dict), ("export", export),
                ("checkpoint_dir", checkpoint_dir),
            )
            if value is not None
        }
        if len(given) > 1:
            raise SubmitError(step, f"pass exactly one source, got {', '.join(sorted(given))}")
        if not isinstance(force, bool):
            raise SubmitError(step, f"force must be a bool, got {force!r}")
        if require_marker is not None and not isinstance(require_marker, bool):
            raise SubmitError(step, f"require_marker must be a bool or None, got {require_marker!r}")
        config = self.config
        if not given:
            reuse = config.reuse_path(step)
            if reuse is None or config.staging_dir is not None:
                raise SubmitError(
                    step,
                    "no source: pass one of model=, state_dict=, export=, checkpoint_dir= "
                    "(or set EvalConfig.save_hf without hf_dir to reuse the trainer's checkpoints)",
                )
            marker = True if require_marker is None else require_marker
            point = Point(step, Source.CHECKPOINT, force, checkpoint=reuse, require_marker=marker)
            return point, None
        if require_marker is not None and checkpoint_dir is None:
            raise SubmitError(step, "require_marker applies only to checkpoint_dir=")
        if checkpoint_dir is not None:
            if not isinstance(checkpoint_dir, str | os.PathLike):
                raise SubmitError(step, f"checkpoint_dir must be a path, got {checkpoint_dir!r}")
            path = os.path.abspath(os.fspath(checkpoint_dir))
            marker = bool(require_marker)
            point = Point(step, Source.CHECKPOINT, force, checkpoint=path, require_marker=marker)
            return point, None
        if config.staging_dir is None:
            raise SubmitError(step, f"{next(iter(given))}= needs EvalConfig.hf_dir to export into")
        if export is not None:
            if not callable(export):
                raise SubmitError(step, f"export must be an async callable (step, path), got {export!r}")
            return Point(step, Source.EXPORT, force, export=export), None
        if model is not None and not isinstance(model, torch.nn.Module):
            raise SubmitError(step, f"model must be a torch.nn.Module, got {type(model).__name__}")
        if state_dict is not None and not isinstance(state_dict, Mapping):
            kind = type(state_dict).__name__
            raise SubmitError(step, f"state_dict must be a mapping of tensors, got {kind}")
        source = model if model is not None else state_dict
        assert source is not None
        try:
            plan = plan_state(source)
        except (TypeError, ValueError) as exc:
            raise SubmitError(step, str(exc)) from exc
        return Point(step, Source.WEIGHTS, force), plan

    async def _wait_for_slot(self, point: Point) -> bool:
        pipeline = self._running_pipeline()
        config = self.config
        while len(pipeline.in_flight) + self._reserved >= config.max_in_flight:
            if not point.force and config.overflow == "skip":
                pipeline.fail(point, "busy", f"{config.max_in_flight} points already in flight")
                pipeline.settle(point)
                return False
            if not point.force and config.overflow == "latest":
                for queued in list(pipeline.in_flight.values()):
                    if queued.supersedable:
                        pipeline.drop(queued, "superseded", f"superseded by step {point.step}")
            await pipeline.wait_changed()
            self._running_pipeline()
        self._reserved += 1
        return True

    async def _lease_buffers(self, point: Point, plan: StatePlan) -> BufferLease | None:
        """Lease the buffer set the copy goes into (one per slot). Only a set that an export
        thread abandoned at a timeout or supersede still reads can be missing: wait for that
        thread to stop (it does at its next chunk), or under ``overflow="skip"`` settle
        ``busy``. Cancelling the wait admits nothing."""
        pipeline = self._running_pipeline()
        try:
            while True:
                lease = pipeline.buffers.try_lease(plan.buffer_nbytes, pinned=plan.on_cuda)
                if lease is not None:
                    return lease
                if not point.force and self.config.overflow == "skip":
                    self._reserved -= 1
                    reason = "every weight buffer is read by an abandoned export"
                    pipeline.fail(point, "busy", reason)
                    pipeline.settle(point)
                    return None
                await pipeline.wait_changed()
                self._running_pipeline()
        except BaseException:
            self._reserved -= 1
            self._steps.discard(point.step)
            pipeline.wake()
            raise

    def _disk_has_room(self, nbytes: int) -> bool:
        pipeline = self._pipeline
        assert pipeline is not None and pipeline.staging_dir is not None
        pending = sum(
            p.weights.nbytes for p in pipeline.in_flight.values() if p.weights is not None
        )
        free = staging.free_bytes(pipeline.staging_dir)
        return free - pending - DISK_HEADROOM_BYTES >= nbytes

    def _running_pipeline(self, *, allow_closing: bool = False) -> Pipeline:
        if self._gave_up is not None:
            raise SupervisorGaveUpError(
                "the supervisor gave up after too many actor crashes; it admits nothing more"
            ) from self._gave_up
        if self._closing and not allow_closing:
            raise SupervisorClosedError("the supervisor is closed; it admits nothing more")
        if self._pipeline is None:
            raise SupervisorClosedError("the supervisor is not running; use EvalSupervisor.open")
        return self._pipeline

    # -- supervision -------------------------------------------------------------------------

    def _on_crash(self, actor: str, exc: Exception) -> None:
        log.error("actor %s crashed", actor, exc_info=exc)
        if self._pipeline is not None:
            self._pipeline.holder_crashed(actor, exc)

    def _on_give_up(self, exc: Exception) -> None:
        log.error("too many actor crashes; the supervisor stops", exc_info=exc)
        self._gave_up = exc
        if self._pipeline is not None:
            self._pipeline.settle_now("crashed", f"the supervisor gave up: {exc!r}")
            self._pipeline.wake()

    # -- drain and close ---------------------------------------------------------------------

    async def drain(self, timeout: float | None = None) -> DrainReport:  # noqa: ASYNC109 - a budget
        """Wait until the points now in flight have settled, for at most ``timeout`` seconds
        (None: no bound). Never raises on timeout: the report says what is still pending."""
        pipeline = self._pipeline
        if pipeline is None:
            return DrainReport(settled=[], pending=[])
        waiting = sorted(pipeline.in_flight)
        with trio.move_on_after(math.inf if timeout is None else timeout):
            while any(step in pipeline.in_flight for step in waiting):
                await pipeline.wait_changed()
        return DrainReport(
            settled=[s for s in waiting if s in pipeline.settled_steps],
            pending=[s for s in waiting if s not in pipeline.settled_steps],
        )

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
        if self._closing:
            await self._close_done.wait()
            assert self._close_report is not None
            return self._close_report
        self._closing = True
        budget = self.config.close_timeout if timeout is None else timeout
        with trio.CancelScope(shield=True):
            deadline = trio.current_time() + budget
            report = await self._close(deadline, budget, drain)
        self._close_report = report
        self._close_done.set()
        return report

    async def _close(self, deadline: float, budget: float, drain: bool) -> CloseReport:
        pipeline, actors = self._pipeline, self._actors
        if pipeline is None or actors is None:
            return CloseReport(clean=True, abandoned=[], stuck_threads=[])
        pipeline.wake()
        reserve = min(CLOSE_RESERVE_MAX, budget * CLOSE_RESERVE_FRACTION)
        with trio.move_on_at(deadline - reserve):
            while drain and pipeline.in_flight:
                await pipeline.wait_changed()
        abandoned = pipeline.settle_now("closed", "abandoned at close")
        with trio.move_on_at(deadline):
            await actors.shutdown()
        actors.cancel()
        pipeline.buffers.close()
        await self._dispose(deadline)
        assert self._invoker is not None
        self._invoker.asyncio_thread.stop(timeout=max(0.0, min(0.2, deadline - trio.current_time())))
        stuck = pipeline.tracker.running()
        if self._invoker.asyncio_thread.running:
            stuck.append("asyncio eval loop")
        clean = not abandoned and not stuck and self._gave_up is None
        log.info("closed: %d abandoned, %d stuck threads", len(abandoned), len(stuck))
        return CloseReport(clean=clean, abandoned=abandoned, stuck_threads=stuck)

    async def _dispose(self, deadline: float) -> None:
        if getattr(type(self.eval_fn), "dispose", None) in (None, CheckpointEvalFn.dispose):
            return
        dispose = self.eval_fn.dispose
        with trio.move_on_at(deadline):
            try:
                if inspect.iscoroutinefunction(dispose):
                    await dispose()
                else:
                    assert self._pipeline is not None
                    await run_blocking(
                        dispose,
                        abandon_on_cancel=True,
                        limiter=trio.CapacityLimiter(1),
                        description="eval fn dispose()",
                        tracker=self._pipeline.tracker,
                    )
            except Exception:
                log.exception("eval fn dispose() failed")

    # -- introspection -----------------------------------------------------------------------

    def statistics(self) -> SupervisorStatistics:
        """Points in flight, settled, skipped by reason, actor restarts."""
        pipeline, actors = self._pipeline, self._actors
        return SupervisorStatistics(
            in_flight=0 if pipeline is None else len(pipeline.in_flight),
            settled=0 if pipeline is None else len(pipeline.settled_steps),
            ok=0 if pipeline is None else pipeline.ok_count,
            skipped_by_reason={} if pipeline is None else dict(pipeline.reasons),
            restarts=0 if actors is None else actors.restarts,
            gave_up=self._gave_up is not None,
            closed=self._closing,
            buffers=None if pipeline is None else pipeline.buffers.statistics(),
        )


def _check_eval_fn(eval_fn: Any) -> None:
    evaluate = getattr(eval_fn, "evaluate_checkpoint", None)
    if not callable(evaluate):
        raise ConfigError(
            "eval_fn", f"{eval_fn!r} has no evaluate_checkpoint(checkpoint_dir, input) method"
        )
    runtime = getattr(eval_fn, "runtime", "trio")
    if runtime not in RUNTIMES:
        raise ConfigError("eval_fn.runtime", f"expected one of {', '.join(RUNTIMES)}, got {runtime!r}")
    is_async = inspect.iscoroutinefunction(evaluate)
    if runtime in ("trio", "asyncio") and not is_async:
        raise ConfigError(
            "eval_fn.evaluate_checkpoint",
            f"runtime={runtime!r} needs an async def; use runtime='thread' for a plain def",
        )
    if runtime == "thread" and is_async:
        raise ConfigError(
            "eval_fn.evaluate_checkpoint",
            "runtime='thread' needs a plain def; use runtime='trio' or 'asyncio' for an async def",
        )


def _fleets(fleet: Fleet | Sequence[Fleet] | None) -> list[Fleet | None]:
    if fleet is None:
        return [None]
    fleets = [fleet] if isinstance(fleet, Fleet) else list(fleet)
    if not fleets or not all(isinstance(f, Fleet) for f in fleets):
        raise ConfigError(
            "fleet", f"expected a Fleet, a non-empty sequence of Fleets, or None, got {fleet!r}"
        )
    if len({id(f) for f in fleets}) != len(fleets):
        raise ConfigError("fleet", "the same Fleet appears twice; each fleet evaluates one point at a time")
    return list(fleets)

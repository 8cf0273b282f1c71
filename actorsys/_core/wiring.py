"""How one supervisor's actors are built and connected.

Admission sends each launched point to the Exporter; the Exporter forwards it to the
FleetPinner, the pinner to the EvalRunner, and every stage hands what settles to the
Retirer's inbox; idle fleets go round the fleet pool's channel (the pinner receives, the
pinner and the runner send back). The supervisor owns every channel here and hands each
actor clones, so a crashing actor never breaks its peers' channels. A drop is no message:
``Ticket.drop`` marks the ticket and cancels its owner's scope (trio's cancellation), and the
point still travels to the Retirer over its inbox. Each actor is a supervised child
(one_for_one); its ``stop`` closes the channel that feeds it, so stopping them in this order
lets every point in the pipeline move on first.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from actorsys._core.admission import Admission
from actorsys._core.journal import Journal
from actorsys._core.submit import FleetKinds
from actorsys._errors import ConfigError
from actorsys.actors.exporter import Exporter
from actorsys.actors.flight import Flight
from actorsys.actors.pinner import FleetPinner, FleetReturns, fleet_pool
from actorsys.actors.point import Point
from actorsys.actors.retirer import Retirer
from actorsys.actors.runner import EvalInvoker, EvalRunner
from actorsys.actors.stage import Stage
from actorsys.actors.weight_gate import WeightGate
from actorsys.config import EvalConfig
from actorsys.contracts import RUNTIMES
from actorsys.fleet import Fleet
from actorsys.fleet.pin.probe import ProbedEngine
from actorsys.outcome import SupervisorStatistics
from actorsys.runtime import ActorSupervisor, ChildSpec, Restart, ThreadTracker
from actorsys.sinks import Sink
from actorsys.sinks.fanout import as_sink
from actorsys.snapshot import BufferPool, prepare_like_checkpoint

log = logging.getLogger("actorsys")

SHUTDOWN_SECONDS = 1.0


@dataclass(frozen=True)
class Wiring:
    flight: Flight
    tracker: ThreadTracker
    buffers: BufferPool
    admission: Admission
    retirer: Retirer
    invoker: EvalInvoker
    actors: ActorSupervisor
    stages: tuple[Stage, ...]
    gate: WeightGate

    def statistics(self) -> SupervisorStatistics:
        retirer = self.retirer
        return SupervisorStatistics(
            in_flight=len(self.flight.unsettled()),
            settled=len(retirer.settled_steps),
            ok=retirer.ok_count,
            skipped_by_reason=dict(retirer.reasons),
            restarts=self.actors.restarts,
            gave_up=self.admission.gave_up is not None,
            closed=self.admission.closing,
            buffers=self.buffers.statistics(),
            weight_update_waits=self.gate.waits,
            weight_update_wait_seconds=self.gate.wait_seconds,
        )

    def give_up(self, exc: Exception) -> None:
        """The actors crashed too often: admit nothing more; what is in flight settles
        ``crashed`` now (the actors are being cancelled)."""
        self.admission.gave_up = exc
        self.retirer.settle_now("crashed", f"the supervisor gave up: {exc!r}")
        self.flight.wake()

    def crashed(self, actor: str, exc: Exception) -> None:
        for stage in self.stages:
            if stage.name == actor:
                stage.crashed(exc)


def wire(
    config: EvalConfig,
    *,
    eval_fn: Any,
    sink: Sink,
    fleets: Sequence[Fleet | None],
    on_crash: Callable[[str, Exception], None],
    on_give_up: Callable[[Exception], None],
    staging_dir: str | None,
    tracker: ThreadTracker,
    journal: Journal | None = None,
) -> Wiring:
    """Build the actors of one supervisor (in the trio thread that will run them), exporting
    into ``staging_dir`` (already claimed and prepared, :mod:`actorsys._core.staging_claim`)
    and journaling its points in ``journal``."""
    flight = Flight()
    buffers = BufferPool(
        config.max_in_flight, on_free=flight.wake_from_any_thread, prepare_spares=True
    )
    if config.base_checkpoint is not None:
        prepare_like_checkpoint(buffers, os.fspath(config.base_checkpoint))
    export_send, export_recv = trio.open_memory_channel[Point](math.inf)
    pin_send, pin_recv = trio.open_memory_channel[Point](math.inf)
    eval_send, eval_recv = trio.open_memory_channel[Point](math.inf)
    retirer = Retirer(config, flight, sink, tracker, staging_dir=staging_dir, journal=journal)
    shared = [f for f in fleets if f is not None and f.shared]
    dedicated = [f for f in fleets if f is None or not f.shared]
    dedicated_returns, idle_fleets = fleet_pool(dedicated)
    shared_returns, idle_shared = fleet_pool(shared)
    returns = FleetReturns(dedicated_returns, shared_returns)
    served_send, served_recv = trio.open_memory_channel[Point](math.inf)
    gate = WeightGate(flight)
    admission = Admission(
        config, flight, retirer, staging_dir, buffers, export_send, tracker,
        fleets=FleetKinds(shared=bool(shared), dedicated=bool(dedicated)),
        served_send=served_send, gate=gate, journal=journal,
    )
    exporter = Exporter(config, flight, retirer, staging_dir, tracker, disk=admission.disk)
    probed = config.probe and any(
        isinstance(engine, ProbedEngine) for fleet in dedicated if fleet for engine in fleet.engines
    )
    pinner = FleetPinner(
        config, flight, retirer, idle_fleets, returns.clone(), warm_references=probed
    )
    shared_pinner = FleetPinner(config, flight, retirer, idle_shared, returns.clone(), gate=gate)
    invoker = EvalInvoker(eval_fn, tracker)
    runner = EvalRunner(config, flight, retirer, returns.clone(), invoker)

    async def run_exporter() -> None:
        await exporter.run(export_recv.clone(), pin_send.clone())

    async def run_pinner() -> None:
        await pinner.run(pin_recv.clone(), eval_send.clone())

    async def run_shared_pinner() -> None:
        await shared_pinner.run(served_recv.clone(), eval_send.clone())

    async def run_runner() -> None:
        await runner.run(eval_recv.clone())

    async def run_retirer() -> None:
        await retirer.run(retirer.inbox.clone())

    def child(name: str, run: Callable[[], Any], stop: Callable[[], None]) -> ChildSpec:
        return ChildSpec(name, run, Restart.TRANSIENT, SHUTDOWN_SECONDS, stop)

    children = [
        child(exporter.name, run_exporter, export_send.close),
        child(pinner.name, run_pinner, pin_send.close),
    ]
    stages: tuple[Stage, ...] = (exporter, pinner, runner)
    if shared:
        children.append(child(shared_pinner.name, run_shared_pinner, served_send.close))
        stages = (exporter, pinner, shared_pinner, runner)
    actors = ActorSupervisor(
        [
            *children,
            child(runner.name, run_runner, eval_send.close),
            child(retirer.name, run_retirer, retirer.inbox_send.close),
        ],
        max_restarts=config.max_restarts,
        restart_period=config.restart_period,
        on_crash=on_crash,
        on_give_up=on_give_up,
    )
    return Wiring(flight, tracker, buffers, admission, retirer, invoker, actors, stages, gate)


def check_collaborators(
    config: object, eval_fn: object, fleet: object, sink: object
) -> tuple[list[Fleet | None], Sink]:
    """Check what a supervisor is built from; the fleets to lend out, and the sink to use.

    Raises :class:`~actorsys.ConfigError` naming the argument that is unusable.
    """
    if not isinstance(config, EvalConfig):
        raise ConfigError("config", f"expected an EvalConfig, got {type(config).__name__}")
    _check_eval_fn(eval_fn)
    fleets = _fleets(fleet)
    if config.resume and all(f is not None and f.shared for f in fleets):
        # A crashed run's points are evaluated again from their snapshots, which only a
        # fleet actorsys may reload can serve; resuming with none would wait forever.
        raise ConfigError(
            "resume", "every fleet is shared, and resumed points need one actorsys may reload; "
            "add a dedicated fleet or drop resume"
        )
    return fleets, as_sink(sink)  # type: ignore[arg-type]


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


def _fleets(fleet: object) -> list[Fleet | None]:
    if fleet is None:
        return [None]
    fleets = [fleet] if isinstance(fleet, Fleet) else list(fleet)  # type: ignore[call-overload]
    if not fleets or not all(isinstance(f, Fleet) for f in fleets):
        raise ConfigError(
            "fleet", f"expected a Fleet, a non-empty sequence of Fleets, or None, got {fleet!r}"
        )
    if len({id(f) for f in fleets}) != len(fleets):
        raise ConfigError("fleet", "the same Fleet appears twice; each fleet evaluates one point at a time")
    return list(fleets)

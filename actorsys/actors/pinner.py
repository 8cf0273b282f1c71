"""FleetPinner: leases an idle fleet and pins every engine in it to the point's version."""

from __future__ import annotations

import trio

from actorsys._pipeline import Pipeline
from actorsys._point import Point, Stage
from actorsys.fleet import PinError
from actorsys.outcome import PIN_TIME_SECONDS

NAME = "pinner"


async def run_pinner(
    pipeline: Pipeline,
    inbox: trio.MemoryReceiveChannel[Point],
    onward: trio.MemorySendChannel[Point],
) -> None:
    async with inbox, onward:
        async for point in inbox:
            if point.drop_reason is not None:
                continue
            with pipeline.hold(point, NAME):
                fleet = await pipeline.pool_recv.receive()
                pipeline.lease_fleet(point, fleet)
                point.pin_started = True
                await _pin(pipeline, point)
            pipeline.release(point, onward, Stage.EVAL)


async def _pin(pipeline: Pipeline, point: Point) -> None:
    version = str(point.step)
    fleet = point.fleet
    config = pipeline.config
    started = trio.current_time()
    try:
        if fleet is None:
            point.weight_version = version
            return
        assert point.snapshot is not None
        with trio.move_on_after(config.pin_timeout) as deadline:
            await fleet.pin(point.snapshot, version, retries=config.pin_retries, probe=config.probe)
            point.weight_version = version
        if deadline.cancelled_caught:
            pipeline.fail(
                point, "pin_timeout", f"pin of {fleet!r} took longer than {config.pin_timeout} s"
            )
    except PinError as exc:
        pipeline.fail(point, exc.reason, str(exc))
    finally:
        point.metrics[PIN_TIME_SECONDS] = trio.current_time() - started

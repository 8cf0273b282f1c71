"""Exporter: turns a submitted point into a complete checkpoint directory on disk."""

from __future__ import annotations

import math
import os

import trio

from actorsys import staging
from actorsys._pipeline import Pipeline
from actorsys._point import Point, Source, Stage
from actorsys.outcome import EXPORT_TIME_SECONDS
from actorsys.runtime import run_blocking
from actorsys.snapshot import write_snapshot

NAME = "exporter"


async def run_exporter(
    pipeline: Pipeline,
    inbox: trio.MemoryReceiveChannel[Point],
    onward: trio.MemorySendChannel[Point],
    limiter: trio.CapacityLimiter,
) -> None:
    async with inbox, onward:
        async for point in inbox:
            if point.drop_reason is not None:
                continue
            with pipeline.hold(point, NAME):
                started = trio.current_time()
                try:
                    await _export(pipeline, point, limiter)
                finally:
                    point.metrics[EXPORT_TIME_SECONDS] = trio.current_time() - started
            point.release_weights()
            pipeline.release(point, onward, Stage.PIN)


async def _export(pipeline: Pipeline, point: Point, limiter: trio.CapacityLimiter) -> None:
    if point.source is Source.CHECKPOINT:
        _check_existing(pipeline, point)
        return
    timeout = pipeline.config.export_timeout
    with trio.move_on_after(math.inf if timeout is None else timeout) as deadline:
        await _write(pipeline, point, limiter)
    if deadline.cancelled_caught:
        pipeline.fail(point, "export_timeout", f"export took longer than {timeout} s")


def _check_existing(pipeline: Pipeline, point: Point) -> None:
    path = point.checkpoint
    assert path is not None
    if not os.path.isdir(path):
        pipeline.fail(point, "ckpt_missing", f"{path} is not a directory")
    elif point.require_marker and not staging.is_complete(path):
        pipeline.fail(point, "ckpt_missing", f"{path} has no {staging.COMPLETE} marker")
    else:
        point.snapshot = path


async def _write(pipeline: Pipeline, point: Point, limiter: trio.CapacityLimiter) -> None:
    staging_dir = pipeline.staging_dir
    assert staging_dir is not None
    tmp: str | None = None
    try:
        tmp = staging.new_tmp_dir(staging_dir, point.step)
        if point.source is Source.WEIGHTS:
            weights, directory = point.weights, tmp
            assert weights is not None
            base = pipeline.config.base_checkpoint
            await run_blocking(
                lambda: write_snapshot(
                    weights,
                    directory,
                    base_checkpoint=None if base is None else os.fspath(base),
                    max_shard_size=pipeline.config.max_shard_size,
                ),
                abandon_on_cancel=True,
                limiter=limiter,
                description=f"export of step {point.step}",
                tracker=pipeline.tracker,
            )
        else:
            assert point.export is not None
            await point.export(point.step, tmp)
            if not staging.has_weights(tmp):
                pipeline.fail(point, "export_failed", f"export of step {point.step} wrote no weight files")
                return
        final = staging.final_dir(staging_dir, point.step)
        staging.publish(tmp, final)
        point.snapshot, point.owned = final, True
    except Exception as exc:
        pipeline.fail(point, "export_failed", f"{type(exc).__name__}: {exc}")
    finally:
        if tmp is not None and (point.snapshot is None or not point.owned):
            staging.discard(tmp)

"""Exporter: turns a submitted point into a complete checkpoint directory on disk.

It owns the points waiting for their export and the one being written, and the captured
weights until the snapshot is written. Every file operation (the tmp dir, the write, the
fsyncs and the atomic rename of ``publish``, a discard) runs in a worker thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import trio

from actorsys import staging
from actorsys._flight import Flight
from actorsys._point import Point, Source, State
from actorsys.actors._stage import Done, Result, SequentialStage, Skip, within
from actorsys.actors.retirer import Retirer
from actorsys.config import EvalConfig
from actorsys.outcome import EXPORT_TIME_SECONDS
from actorsys.runtime import ThreadTracker, run_blocking
from actorsys.snapshot import write_snapshot

T = TypeVar("T")

NAME = "exporter"


class Exporter(SequentialStage):
    name = NAME
    state = State.EXPORT
    next_state = State.PIN
    metric = EXPORT_TIME_SECONDS

    def __init__(
        self,
        config: EvalConfig,
        flight: Flight,
        retirer: Retirer,
        staging_dir: str | None,
        tracker: ThreadTracker,
    ) -> None:
        super().__init__(flight, retirer)
        self.config = config
        self.staging_dir = staging_dir
        self.tracker = tracker
        self.write_limiter = trio.CapacityLimiter(config.max_in_flight)
        self.file_limiter = trio.CapacityLimiter(1)

    def leave(self, point: Point, *, done: bool) -> Point:
        if point.weights is None:
            return point
        point.weights.release()
        return point.but(weights=None)

    async def work(self, point: Point) -> Result:
        if point.source is Source.CHECKPOINT:
            return self._check_existing(point)
        timeout = self.config.export_timeout
        with within(timeout) as deadline:
            return await self._write(point)
        assert deadline.cancelled_caught
        return Skip("export_timeout", f"export took longer than {timeout} s")

    def _check_existing(self, point: Point) -> Result:
        path = point.checkpoint
        assert path is not None
        if not os.path.isdir(path):
            return Skip("ckpt_missing", f"{path} is not a directory")
        if point.require_marker and not staging.is_complete(path):
            return Skip("ckpt_missing", f"{path} has no {staging.COMPLETE} marker")
        return Done(point.but(snapshot=path))

    async def _write(self, point: Point) -> Result:
        staging_dir = self.staging_dir
        assert staging_dir is not None
        step = point.step
        tmp: str | None = None
        published = False
        try:
            tmp = staging.new_tmp_dir(staging_dir, step)
            directory = tmp
            if point.source is Source.WEIGHTS:
                weights = point.weights
                assert weights is not None
                base = self.config.base_checkpoint
                await run_blocking(
                    lambda: write_snapshot(
                        weights,
                        directory,
                        base_checkpoint=None if base is None else os.fspath(base),
                        max_shard_size=self.config.max_shard_size,
                    ),
                    abandon_on_cancel=True,
                    limiter=self.write_limiter,
                    description=f"export of step {step}",
                    tracker=self.tracker,
                )
            else:
                assert point.export is not None
                await point.export(step, directory)
                if not staging.has_weights(directory):
                    return Skip("export_failed", f"export of step {step} wrote no weight files")
            final = staging.final_dir(staging_dir, step)
            staging.publish(directory, final)
            published = True
            return Done(point.but(snapshot=final))
        except Exception as exc:
            return Skip("export_failed", f"{type(exc).__name__}: {exc}")
        finally:
            if tmp is not None and not published:
                doomed = tmp
                with trio.CancelScope(shield=True):
                    await self._files(lambda: staging.discard(doomed), "discard")

    async def _files(self, fn: Callable[[], T], what: str) -> T:
        """Short file work (mkdir, fsync, rename, rmtree of a partial dir): not abandoned, so
        its effect is known when this returns."""
        return await run_blocking(
            fn,
            abandon_on_cancel=False,
            limiter=self.file_limiter,
            description=f"exporter: {what}",
            tracker=self.tracker,
        )

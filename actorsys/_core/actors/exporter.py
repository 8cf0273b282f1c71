"""Exporter: turns a submitted point into a complete checkpoint directory on disk.

It owns the points waiting for their export and the one being written, and the captured
weights until the snapshot is written. The write of captured weights, with every fsync of the
snapshot, runs in a worker thread; a tmp dir an export did not finish goes on with the point
for the Retirer to delete (in its thread). What stays
in the trio thread is metadata on the staging dir: creating the tmp dir, the rename that
publishes it (with the fsync of the staging dir), and the seal of a delegated export (whose
files the export fn wrote and flushed itself).
"""

from __future__ import annotations

import os

import trio

from actorsys import staging
from actorsys._core.actors.retirer import Retirer
from actorsys._core.actors.stage import Done, Result, SequentialStage, Skip, within
from actorsys._core.flight import Flight
from actorsys._core.point import Point, Source, State
from actorsys.config import EvalConfig
from actorsys.outcome import EXPORT_TIME_SECONDS
from actorsys.runtime import ThreadTracker, run_blocking
from actorsys.snapshot import write_snapshot

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
        self._scratch: dict[int, str] = {}

    def leave(self, point: Point, *, done: bool) -> Point:
        """The weights are no longer needed; a tmp dir the export left goes with the point,
        for the Retirer to delete."""
        if point.weights is not None:
            point.weights.release()
        return point.but(weights=None, scratch=self._scratch.pop(point.step, point.scratch))

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
        try:
            if point.source is Source.WEIGHTS:
                directory = staging.tmp_path(staging_dir, step)
                self._scratch[step] = staging.make_tmp_dir(directory, durable=False)
                await run_blocking(
                    lambda: self._write_weights(point, directory),
                    abandon_on_cancel=True,
                    limiter=self.write_limiter,
                    description=f"export of step {step}",
                    tracker=self.tracker,
                )
            else:
                # A delegated export: the tmp dir and the seal are a few metadata writes,
                # done here so no thread hop delays the point (the export itself awaits).
                directory = self._scratch[step] = staging.new_tmp_dir(staging_dir, step)
                assert point.export is not None
                await point.export(step, directory)
                if not staging.has_weights(directory):
                    return Skip("export_failed", f"export of step {step} wrote no weight files")
                staging.seal(directory)
            final = staging.final_dir(staging_dir, step)
            staging.install(directory, final)
            del self._scratch[step]
            return Done(point.but(snapshot=final))
        except Exception as exc:
            return Skip("export_failed", f"{type(exc).__name__}: {exc}")

    def _write_weights(self, point: Point, tmp: str) -> None:
        """In the export thread: the snapshot and its seal (every fsync). It only ever writes
        into ``tmp``, so it is safe to abandon."""
        assert point.weights is not None
        base = self.config.base_checkpoint
        write_snapshot(
            point.weights,
            tmp,
            base_checkpoint=None if base is None else os.fspath(base),
            max_shard_size=self.config.max_shard_size,
        )
        staging.seal(tmp)

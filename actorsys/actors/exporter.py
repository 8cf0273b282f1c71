"""Exporter: turns a submitted point into a complete checkpoint directory on disk.

It owns the points waiting for their export and the one being written, and the captured
weights until the snapshot is written. No file operation runs in the trio thread. The write
of captured weights, with every fsync of the snapshot, runs in a worker thread that a timeout
or a drop abandons (it writes only into the point's tmp dir); a tmp dir an export did not
finish goes on with the point for the Retirer to delete. The metadata operations (checking a
given checkpoint, creating the tmp dir, sealing a delegated export, the rename that publishes
a snapshot with the fsync of the staging dir) run in worker threads that are waited for: each
is a few system calls, and an abandoned rename could publish a snapshot nobody retires.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol, TypeVar

import trio

from actorsys import staging
from actorsys.actors.flight import Flight
from actorsys.actors.point import Point, Source, State
from actorsys.actors.retirer import Retirer
from actorsys.actors.stage import Done, Result, SequentialStage, Skip, within
from actorsys.config import EvalConfig
from actorsys.outcome import EXPORT_TIME_SECONDS
from actorsys.runtime import ThreadTracker, run_blocking
from actorsys.snapshot import write_snapshot

NAME = "exporter"

T = TypeVar("T")


class DiskAccount(Protocol):
    """What the Exporter tells the admission's account of the staging disk (the supervisor's
    ``DiskRoom`` is one): the bytes of an admitted point that will not be written any more."""

    def left(self, nbytes: int) -> None: ...


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
        *,
        disk: DiskAccount | None = None,
    ) -> None:
        super().__init__(flight, retirer)
        self.config = config
        self.staging_dir = staging_dir
        self.tracker = tracker
        self.disk = disk
        self.write_limiter = trio.CapacityLimiter(config.max_in_flight)
        self.file_limiter = trio.CapacityLimiter(1)
        self._scratch: dict[int, str] = {}

    def leave(self, point: Point, *, done: bool) -> Point:
        """The weights are no longer needed; a tmp dir the export left goes with the point,
        for the Retirer to delete. Its bytes no longer count as still to be written."""
        weights = point.weights
        if weights is not None:
            if self.disk is not None and not weights.released:
                self.disk.left(weights.nbytes)
            weights.release()
        return point.but(weights=None, scratch=self._scratch.pop(point.step, point.scratch))

    async def work(self, point: Point) -> Result:
        if point.source is Source.CHECKPOINT:
            return await self._files(lambda: _check_existing(point), f"check of step {point.step}")
        if point.snapshot is not None:
            # Written already (a crashed run's point, evaluated again): only checked.
            return await self._files(lambda: _check_written(point), f"check of step {point.step}")
        timeout = self.config.export_timeout
        with within(timeout) as deadline:
            return await self._write(point)
        assert deadline.cancelled_caught
        return Skip("export_timeout", f"export took longer than {timeout} s")

    async def _files(self, fn: Callable[[], T], description: str) -> T:
        """A few metadata operations on the staging dir, in a worker thread; waited for even
        when cancelled (see the module's docstring)."""
        return await run_blocking(
            fn,
            abandon_on_cancel=False,
            limiter=self.file_limiter,
            description=description,
            tracker=self.tracker,
        )

    async def _write(self, point: Point) -> Result:
        staging_dir = self.staging_dir
        assert staging_dir is not None
        step = point.step
        try:
            directory = self._scratch[step] = staging.tmp_path(staging_dir, step)
            if point.source is Source.WEIGHTS:
                await self._files(
                    lambda: staging.make_tmp_dir(directory, durable=False), f"tmp dir of step {step}"
                )
                await run_blocking(
                    lambda: self._write_weights(point, directory),
                    abandon_on_cancel=True,
                    limiter=self.write_limiter,
                    description=f"export of step {step}",
                    tracker=self.tracker,
                )
            else:
                await self._files(lambda: staging.make_tmp_dir(directory), f"tmp dir of step {step}")
                assert point.export is not None
                await point.export(step, directory)
                if not await self._files(lambda: _seal_delegated(directory), f"seal of step {step}"):
                    return Skip("export_failed", f"export of step {step} wrote no weight files")
            final = staging.final_dir(staging_dir, step)
            await self._files(lambda: staging.install(directory, final), f"publish of step {step}")
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


def _check_existing(point: Point) -> Result:
    path = point.checkpoint
    assert path is not None
    if not os.path.isdir(path):
        return Skip("ckpt_missing", f"{path} is not a directory")
    if point.require_marker and not staging.is_complete(path):
        return Skip("ckpt_missing", f"{path} has no {staging.COMPLETE} marker")
    return Done(point.but(snapshot=path))


def _check_written(point: Point) -> Result:
    path = point.snapshot
    assert path is not None
    if not staging.is_ours(path) or not staging.is_complete(path):
        # Not ours to delete either: the point goes on without it.
        return Skip("ckpt_missing", f"{path} is no longer a complete snapshot of ours",
                    point.but(snapshot=None))
    return Done(point)


def _seal_delegated(directory: str) -> bool:
    """Seal what a delegated export wrote (it wrote and flushed its files itself); False if it
    wrote no weight file."""
    if not staging.has_weights(directory):
        return False
    staging.seal(directory)
    return True

"""The embedded engine's batching: requests that arrive together are generated in one batch on
its :class:`ModelHost`, and a weight load waits for the running batch (no batch starts until the
load is done), so every answer comes from one checkpoint. Queued requests are batched by their
``priority`` (lower first, ties by arrival, as vLLM's ``--scheduling-policy priority`` and
sglang's ``--schedule-low-priority-values-first`` order; a request without one is 0), so a
trainer's rollouts queued behind an evaluation's requests of a larger priority are generated
first. A batch that fails as a whole is
generated again request by request, so one request the checks missed fails alone, never the
requests batched with it. Model work runs in a worker thread; written on anyio.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio

from actorsys.fleet.embedded.model import GenerationRequest, GenerationResult, ModelHost

__all__ = ["GenerationBatcher"]

log = logging.getLogger("actorsys.engine")


class _GenerationFailed(RuntimeError):
    """The model raised while generating a batch (answered as HTTP 500): a signal between the
    batcher and the server, never raised to a caller of the engine."""


@dataclass(eq=False)
class _Job:
    """A group of sequences answered together (one HTTP request), always in one batch."""

    requests: list[GenerationRequest]
    done: anyio.Event = field(default_factory=anyio.Event)
    results: list[GenerationResult] = field(default_factory=list)
    error: str | None = None


class GenerationBatcher:
    """The model host, its lock and the batch queue of one engine.

    ``run`` must be running (in a nursery) for generation to make progress.
    """

    def __init__(self, host: ModelHost, *, max_batch: int = 16) -> None:
        self.host = host
        self.max_batch = max_batch
        self.lock = anyio.Lock()
        # Weight loads (their bodies and checks) wait on a limiter of their own: requests'
        # parsing and rendering can never keep a load from starting.
        self.load_limiter = anyio.CapacityLimiter(1)
        # (priority, arrival, job): the heap's smallest is the next job to batch.
        self._queue: list[tuple[int, int, _Job]] = []
        self._arrivals = itertools.count()
        self._queued = anyio.Event()
        self._closed = False

    def close(self) -> None:
        """Let ``run`` return once the queued jobs are done; no job can be queued after."""
        self._closed = True
        self._queued.set()

    async def run(self) -> None:
        """Take the queued jobs in priority order, as many as fit in ``max_batch`` sequences,
        and generate them in one batch, until ``close``. Cancelling it stops generation
        (waiting requests never end)."""
        while True:
            while not self._queue:
                if self._closed:
                    return
                await self._queued.wait()
                self._queued = anyio.Event()
            jobs = [heapq.heappop(self._queue)[2]]
            size = len(jobs[0].requests)
            while size < self.max_batch and self._queue:
                job = heapq.heappop(self._queue)[2]
                jobs.append(job)
                size += len(job.requests)
            await self._generate_jobs(jobs)

    async def _generate_jobs(self, jobs: list[_Job]) -> None:
        """Generate ``jobs`` in one batch and answer each; if the batch fails, generate each
        job alone, so only the jobs that fail on their own get the error."""
        batch = [request for job in jobs for request in job.requests]
        try:
            async with self.lock:
                results = await anyio.to_thread.run_sync(self.host.generate, batch)
        except Exception as exc:
            if len(jobs) > 1:
                log.warning("a batch of %d requests failed (%r); generating them one by one",
                            len(jobs), exc)
                for job in jobs:
                    await self._generate_jobs([job])
                return
            log.exception("generation failed")
            jobs[0].error = f"generation failed: {exc!r}"
            jobs[0].done.set()
            return
        offset = 0
        for job in jobs:
            job.results = results[offset : offset + len(job.requests)]
            offset += len(job.requests)
            job.done.set()

    async def generate(
        self, requests: Sequence[GenerationRequest], *, priority: int = 0
    ) -> list[GenerationResult]:
        """Queue ``requests`` as one group of ``priority`` (lower is batched first) and wait
        for their results. Raises :class:`_GenerationFailed` if the model raised on their
        batch, ``anyio.ClosedResourceError`` after ``close``."""
        if self._closed:
            raise anyio.ClosedResourceError
        job = _Job(list(requests))
        heapq.heappush(self._queue, (priority, next(self._arrivals), job))
        self._queued.set()
        await job.done.wait()
        if job.error is not None:
            raise _GenerationFailed(job.error)
        return job.results

    async def load(self, path: str, version: str | None, require_complete: bool) -> None:
        """Swap in the weights at ``path`` once the running batch is done. Raises
        :class:`~actorsys.fleet.checkpoint.CheckpointMismatchError` (the served weights are
        then unchanged).

        The checkpoint is checked first, outside the lock (generation goes on meanwhile), on
        the loads' own limiter, so a bad checkpoint is refused without pausing anything; the
        load checks it again under the lock (a few KB of headers) before it copies."""
        async with self.load_limiter:
            await anyio.to_thread.run_sync(
                lambda: self.host.check(path, require_complete=require_complete)
            )
        async with self.lock:
            await anyio.to_thread.run_sync(
                lambda: self.host.load(path, version, require_complete=require_complete)
            )

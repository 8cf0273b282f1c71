"""The embedded engine's batching: requests that arrive together are generated in one batch on
its :class:`ModelHost`, and a weight load waits for the running batch (no batch starts until the
load is done), so every answer comes from one checkpoint.

Queued requests are batched by their ``priority`` (lower first, ties by arrival, as vLLM's
``--scheduling-policy priority`` and sglang's ``--schedule-low-priority-values-first`` order; a
request without one is 0), so a trainer's rollouts queued behind an evaluation's requests of a
larger priority are generated first. A batch runs until its every sequence is done, so a
rollout that came just after a batch of evaluation requests started would wait for all of it:
where only work of a larger priority is queued and work of a smaller one was answered less
than ``priority_grace`` ago (a trainer's rollout loop turning around), the batch waits out the
rest of that grace for it to come back, and the two are batched together.

A batch holds at most ``max_batch`` sequences: a request of more (``n=256``, a list of
prompts) is generated in slices that fill the batches in turn, its remainder queued again
after each slice, so the requests queued behind it are batched beside its slices instead of
waiting for all of it; a weight load waits until every such request is whole, so its answers
too come from one checkpoint. A batch that fails as a whole is generated again request by
request, so one request the checks missed fails alone, never the requests batched with it.
Model work runs in a worker thread; written on anyio.
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
    """A group of sequences answered together (one HTTP request): in one batch, or, when it
    holds more than ``max_batch``, in slices of consecutive batches with no weight load
    between them. ``taken``: how many of its sequences have gone into a batch."""

    requests: list[GenerationRequest]
    priority: int = 0
    done: anyio.Event = field(default_factory=anyio.Event)
    results: list[GenerationResult | None] = field(default_factory=list)
    taken: int = 0
    finished: int = 0
    error: str | None = None


PRIORITY_GRACE = 0.05
"""Seconds a batch of only larger-priority work waits for the smaller-priority work answered
just before it to come back: longer than a client takes from one answer to its next request on
loopback (a few ms), short beside a batch (tens of ms a token)."""

_Slice = tuple[_Job, int, int]
"""Sequences ``[start, stop)`` of a job, generated in one batch."""
_Queued = tuple[int, int, _Job]
"""(priority, arrival, job): the heap's smallest is the next job to batch."""


class GenerationBatcher:
    """The model host, its lock and the batch queue of one engine.

    ``run`` must be running (in a nursery) for generation to make progress.
    """

    def __init__(
        self, host: ModelHost, *, max_batch: int = 16, priority_grace: float = PRIORITY_GRACE
    ) -> None:
        self.host = host
        self.max_batch = max_batch
        self.priority_grace = priority_grace
        # priority -> when a job of it was last answered (anyio's clock)
        self._answered: dict[int, float] = {}
        self.lock = anyio.Lock()
        # Weight loads (their bodies and checks) wait on a limiter of their own: requests'
        # parsing and rendering can never keep a load from starting.
        self.load_limiter = anyio.CapacityLimiter(1)
        self._queue: list[_Queued] = []
        self._arrivals = itertools.count()
        self._queued = anyio.Event()
        self._closed = False
        # Jobs of which some slices were generated and some are still queued. While there
        # are any, ``run`` keeps the lock (a load between two slices would answer one
        # request from two checkpoints); while a load waits, it only finishes them.
        self._partial: set[_Job] = set()
        self._loads_waiting = 0

    def close(self) -> None:
        """Let ``run`` return once the queued jobs are done; no job can be queued after."""
        self._closed = True
        self._queued.set()

    async def run(self) -> None:
        """Take the queued jobs in priority order, at most ``max_batch`` sequences a batch,
        and generate them, until ``close``. The lock is held from one batch to the next while
        a job is partly generated. Cancelling it stops generation (waiting requests never
        end)."""
        while True:
            while not self._queue:
                if self._closed:
                    return
                await self._queued.wait()
                self._queued = anyio.Event()
            if await self._waited_for_returning_work():
                continue  # the queue is read again
            # The batch is chosen, then waits for a load that holds the lock (it is then
            # generated from the new weights, all of it).
            batch = self._take_batch(only_partial=False)
            async with self.lock:
                while batch:
                    await self._generate_slices(batch)
                    if not self._partial:
                        break
                    batch = self._take_batch(only_partial=bool(self._loads_waiting))

    async def _waited_for_returning_work(self) -> bool:
        """Where every queued job has a larger priority than a job answered less than
        ``priority_grace`` ago, wait for the rest of that grace or until a job is queued, and
        return True; else return False at once."""
        now = anyio.current_time()
        # one expression for "until when", so the wait's end and this test agree exactly
        self._answered = {priority: at for priority, at in self._answered.items()
                          if at + self.priority_grace > now}
        head = self._queue[0][0]
        until = [at + self.priority_grace for priority, at in self._answered.items()
                 if priority < head]
        if not until or self._closed:
            return False
        self._queued = anyio.Event()
        with anyio.CancelScope(deadline=max(until)):
            await self._queued.wait()
        return True

    def _take_batch(self, *, only_partial: bool) -> list[_Slice]:
        """The next batch, taken off the queue in priority order: whole jobs while they fit,
        and a slice of a job larger than ``max_batch`` to fill the room (its remainder queues
        again, behind the jobs of its priority queued so far); a job that fits a batch but not
        this one's room waits for the next. ``only_partial``: continue only the jobs already
        partly generated."""
        room = self.max_batch
        batch: list[_Slice] = []
        kept: list[_Queued] = []
        while room > 0 and self._queue:
            entry = heapq.heappop(self._queue)
            job = entry[2]
            if job.error is not None:
                continue  # a slice of it failed: the rest is not generated
            if only_partial and job not in self._partial:
                kept.append(entry)
                continue
            left = len(job.requests) - job.taken
            if left > room and len(job.requests) <= self.max_batch:
                kept.append(entry)
                break
            start, job.taken = job.taken, job.taken + min(left, room)
            batch.append((job, start, job.taken))
            room -= job.taken - start
            if job.taken < len(job.requests):
                # its remainder queues again behind the jobs of its priority that came
                # meanwhile, so they share the next batches instead of waiting for all of it
                self._partial.add(job)
                kept.append((entry[0], next(self._arrivals), job))
            else:
                self._partial.discard(job)
        for entry in kept:
            heapq.heappush(self._queue, entry)
        return batch

    async def _generate_slices(self, batch: list[_Slice]) -> None:
        """Generate ``batch`` (the lock held) and answer each job once all of it is
        generated; if the batch fails, generate each slice alone, so only the jobs that fail
        on their own get the error."""
        requests = [request for job, start, stop in batch for request in job.requests[start:stop]]
        try:
            results = await self._run_model(requests)
        except Exception as exc:
            if len(batch) > 1:
                log.warning("a batch of %d requests failed (%r); generating them one by one",
                            len(batch), exc)
                for part in batch:
                    await self._generate_slices([part])
                return
            log.exception("generation failed")
            job = batch[0][0]
            job.error = f"generation failed: {exc!r}"
            self._partial.discard(job)
            job.done.set()
            return
        offset = 0
        for job, start, stop in batch:
            job.results[start:stop] = results[offset : offset + stop - start]
            offset += stop - start
            job.finished += stop - start
            if job.finished == len(job.requests) and job.error is None:
                self._answered[job.priority] = anyio.current_time()
                job.done.set()

    async def _run_model(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """One batch on the model, in a worker thread."""
        return await anyio.to_thread.run_sync(self.host.generate, requests)

    async def generate(
        self, requests: Sequence[GenerationRequest], *, priority: int = 0
    ) -> list[GenerationResult]:
        """Queue ``requests`` as one group of ``priority`` (lower is batched first) and wait
        for their results, all from one checkpoint. Raises :class:`_GenerationFailed` if the
        model raised on their batch, ``anyio.ClosedResourceError`` after ``close``."""
        if self._closed:
            raise anyio.ClosedResourceError
        if not requests:
            return []
        job = _Job(list(requests), priority, results=[None] * len(requests))
        heapq.heappush(self._queue, (priority, next(self._arrivals), job))
        self._queued.set()
        await job.done.wait()
        if job.error is not None:
            raise _GenerationFailed(job.error)
        return [result for result in job.results if result is not None]

    async def load(self, path: str, version: str | None, require_complete: bool) -> None:
        """Swap in the weights at ``path`` once the running batch is done, and every request
        generated in slices is whole. Raises
        :class:`~actorsys.fleet.checkpoint.CheckpointMismatchError` (the served weights are
        then unchanged).

        The checkpoint is checked first, outside the lock (generation goes on meanwhile), on
        the loads' own limiter, so a bad checkpoint is refused without pausing anything; the
        load checks it again under the lock (a few KB of headers) before it copies."""
        async with self.load_limiter:
            await anyio.to_thread.run_sync(
                lambda: self.host.check(path, require_complete=require_complete)
            )
        self._loads_waiting += 1
        try:
            async with self.lock:
                await anyio.to_thread.run_sync(
                    lambda: self.host.load(path, version, require_complete=require_complete)
                )
        finally:
            self._loads_waiting -= 1

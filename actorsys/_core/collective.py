"""Collective submits: one supervisor per rank of a ``torch.distributed`` job, one pipeline.

In a job of several ranks every rank opens its supervisor with the same config and submits
the same steps in the same order. The rank ``EvalConfig.eval_rank`` (the *evaluating* rank)
runs the pipeline: admission, export, pin, eval, sink. The others (*contributors*) only copy
their local shards of a sharded model and write them into the evaluating rank's snapshot
files (see :mod:`actorsys.snapshot._sharded`); their supervisors admit nothing and record
nothing.

The ranks meet through the job's own key-value store (the one ``init_process_group`` set
up, a ``TCPStore`` across nodes), never through a collective of the process group, so no
rank can block another's training collectives, and every wait is bounded:

- ``open``/``verdict``/``seen/<rank>``: at open, the evaluating rank writes a check file into
  ``hf_dir``; every contributor must see it at the same absolute path (one node: any local
  path; several nodes: a shared filesystem), else every rank's ``open`` raises ``ConfigError``.
- ``decision/<n>``: the evaluating rank's admission answer to the n-th submit (admitted,
  refused, or an error), which every contributor's n-th submit returns (or raises) alike.
- ``ready/<step>``: the snapshot's directory and where each tensor starts in its files,
  once the evaluating rank's export created them; ``done/<step>/<rank>``: a contributor wrote
  its ranges (or why not); ``settled/<step>``: the point left the pipeline, so a contributor
  still waiting to write stops waiting.
- ``beat``: a counter the evaluating rank raises every second while its supervisor is open;
  ``closed``: it closed. A contributor waiting for it gives up (a skip) once the beat stood
  still for ``collective_timeout`` seconds, so a dead evaluating rank never hangs the others;
  the evaluating rank waits for a contributor's shards at most ``collective_timeout``.

The evaluating rank publishes from one messenger thread (a queue, never blocking the trainer
or trio); the other waits run in worker threads.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import math
import os
import queue
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import trio

from actorsys import staging
from actorsys._core.admission import Reservation
from actorsys._core.point import Point, Source
from actorsys._core.submit import SubmitRequest
from actorsys._errors import ActorsysError, ConfigError, SubmitError, SupervisorClosedError
from actorsys.config import EvalConfig
from actorsys.outcome import DrainReport, Outcome
from actorsys.runtime import ThreadTracker, run_blocking
from actorsys.sinks import Sink
from actorsys.snapshot import (
    BufferLease,
    BufferPool,
    CapturedWeights,
    StatePlan,
    capture_shards,
    plan_state,
)
from actorsys.snapshot._sharded import write_pieces

log = logging.getLogger("actorsys")

HEARTBEAT_SECONDS = 1.0
POLL_FIRST_SECONDS = 0.0005
POLL_MAX_SECONDS = 0.002
CHECK_FILE_PREFIX = ".actorsys-ranks-"
_opens = itertools.count()
"""The n-th collective supervisor a process opens meets the n-th of every other rank."""


class PeerGoneError(ActorsysError):
    """Another rank did not answer within ``collective_timeout`` (it died, hung or closed),
    or the job's store held a malformed message where its answer belongs (not JSON, not
    UTF-8, not the expected shape, or a file outside ``hf_dir``): either way a skip."""


MAX_MESSAGE_EXCERPT = 80


def _malformed(key: str, text: object, problem: str) -> PeerGoneError:
    excerpt = repr(text)[:MAX_MESSAGE_EXCERPT]
    return PeerGoneError(f"the message {key!r} in the job's store is malformed ({problem}): "
                         f"{excerpt}")


def _json(key: str, text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _malformed(key, text, f"not JSON: {exc}") from None


def _inside(path: str, root: str) -> bool:
    """Whether ``path`` lies strictly inside ``root`` once links are resolved."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path != root and os.path.commonpath([path, root]) == root


def checked_ready(key: str, ready: Any, hf_dir: str | None) -> tuple[str, dict[str, dict[str, int]]]:
    """The ``ready/<step>`` message ``ready`` (parsed JSON, not None) as (directory, starts),
    or :class:`PeerGoneError`: the directory must lie inside ``hf_dir``, every file name be a
    plain name of that directory, every start a non-negative integer. (The writer checks
    that each range ends inside its file.)"""
    if not isinstance(ready, dict) or not isinstance(ready.get("directory"), str):
        raise _malformed(key, ready, "expected {'directory': ..., 'starts': ...}")
    directory, starts = ready["directory"], ready.get("starts")
    if hf_dir is None or not os.path.isabs(directory) or not _inside(directory, hf_dir):
        raise _malformed(key, directory, f"the directory is not inside hf_dir {hf_dir}")
    if not isinstance(starts, dict):
        raise _malformed(key, starts, "expected the starts as an object")
    for filename, names in starts.items():
        plain = (filename not in ("", ".", "..") and "/" not in filename and "\0" not in filename)
        if not plain:
            raise _malformed(key, filename, "a file name that is not a plain name")
        if not isinstance(names, dict) or not all(
            isinstance(n, str) and type(at) is int and at >= 0 for n, at in names.items()
        ):
            raise _malformed(key, names, "expected tensor names with non-negative offsets")
    return directory, starts


def is_collective_job() -> bool:
    """Whether this process is one rank of a ``torch.distributed`` job of several ranks."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@dataclass(frozen=True)
class Decision:
    step: int
    admitted: bool
    error: str | None = None


class Collective:
    """This rank's side of the meeting; build it with :meth:`join` (blocking)."""

    def __init__(self, config: EvalConfig, store: Any, rank: int, world: int) -> None:
        self.config = config
        self.rank = rank
        self.world = world
        self.eval_rank = config.eval_rank
        self.timeout = config.collective_timeout
        self._store = store
        self._submits = itertools.count()
        self._outbox: queue.SimpleQueue[tuple[str, str] | None] = queue.SimpleQueue()
        self._messenger: threading.Thread | None = None

    @property
    def evaluating(self) -> bool:
        return self.rank == self.eval_rank

    # -- open and close (blocking) -------------------------------------------------------

    @classmethod
    def join(cls, config: EvalConfig) -> Collective | None:
        """Meet the other ranks' supervisors, or None outside a job of several ranks.

        Blocks until every rank opened (at most ``collective_timeout`` seconds); on the
        evaluating rank, creates ``hf_dir``. Raises :class:`ConfigError` for an ``eval_rank``
        outside the job, an ``hf_dir`` some rank does not see, or a rank that never opened.
        """
        if not is_collective_job():
            return None
        dist = torch.distributed
        rank, world = dist.get_rank(), dist.get_world_size()
        if config.eval_rank >= world:
            raise ConfigError(
                "eval_rank", f"expected a rank below the world size {world}, got {config.eval_rank}"
            )
        base = dist.distributed_c10d._get_default_store()
        store = dist.PrefixStore(f"actorsys/{next(_opens)}/", base)
        collective = cls(config, store, rank, world)
        if collective.evaluating:
            collective._meet_as_evaluator()
            collective._messenger = threading.Thread(
                target=collective._send_messages, name="actorsys collective messenger", daemon=True
            )
            collective._messenger.start()
        else:
            collective._meet_as_contributor()
        return collective

    def close(self) -> None:
        """The evaluating rank closed: tell the others, stop the messenger. Never blocks."""
        if self._messenger is not None:
            self._outbox.put(("closed", "1"))
            self._outbox.put(None)

    def _meet_as_evaluator(self) -> None:
        staging_dir = self.config.staging_dir
        path = None if staging_dir is None else staging.prepare_staging_dir(staging_dir)
        token = uuid.uuid4().hex
        check = None if path is None else os.path.join(path, CHECK_FILE_PREFIX + token)
        if check is not None:
            with open(check, "w", encoding="utf-8") as f:
                f.write(token)
        self._store.set("open", json.dumps({"token": token, "hf_dir": path}))
        try:
            problems = []
            for rank in range(self.world):
                if rank != self.rank:
                    seen = self._wait_for(f"seen/{rank}", f"rank {rank} to open its supervisor")
                    if seen != "ok":
                        problems.append(seen)
        except PeerGoneError as exc:
            problems = [str(exc)]
        finally:
            if check is not None:
                os.remove(check)
        verdict = "ok" if not problems else "; ".join(problems) + _HF_DIR_RULE
        self._store.set("verdict", verdict)
        if problems:
            raise ConfigError("hf_dir", verdict)

    def _meet_as_contributor(self) -> None:
        what = f"the evaluating rank {self.eval_rank} to open its supervisor"
        try:
            opened = json.loads(self._wait_for("open", what))
        except PeerGoneError as exc:
            raise ConfigError("eval_rank", f"{exc}; every rank opens one with the same config") from exc
        self._store.set(f"seen/{self.rank}", self._check_hf_dir(opened))
        try:
            verdict = self._wait_for("verdict", what)
        except PeerGoneError as exc:
            raise ConfigError("eval_rank", str(exc)) from exc
        if verdict != "ok":
            raise ConfigError("hf_dir", verdict)

    def _check_hf_dir(self, opened: Mapping[str, Any]) -> str:
        staging_dir = self.config.staging_dir
        mine = None if staging_dir is None else os.path.abspath(staging_dir)
        theirs = opened["hf_dir"]
        if mine != theirs:
            return f"hf_dir is {mine} on rank {self.rank} but {theirs} on rank {self.eval_rank}"
        if theirs is None:
            return "ok"
        check = os.path.join(theirs, CHECK_FILE_PREFIX + opened["token"])
        try:
            with open(check, encoding="utf-8") as f:
                if f.read() == opened["token"]:
                    return "ok"
        except OSError:
            pass
        return f"rank {self.rank} does not see the files rank {self.eval_rank} writes in {theirs}"

    # -- the evaluating rank ---------------------------------------------------------------

    def decided(self, step: int, admitted: bool, error: str | None = None) -> None:
        """Publish the admission answer to this rank's next submit. Never blocks."""
        seq = next(self._submits)
        self._outbox.put((f"decision/{seq}", json.dumps([step, admitted, error], default=repr)))

    def settled(self, step: int) -> None:
        """The point of ``step`` left the pipeline (or was never launched). Never blocks."""
        self._outbox.put((f"settled/{step}", "1"))

    def handover(self, step: int) -> StoreHandover:
        return StoreHandover(self, step)

    def observe(self, sink: Sink) -> Sink:
        """``sink``, and every outcome it records noted as settled for the other ranks."""
        return _SettleNotes(sink, self)

    def _send_messages(self) -> None:
        store = _own_client(self._store)
        beat = 0
        next_beat = time.monotonic()
        while True:
            try:
                message = self._outbox.get(timeout=max(0.0, next_beat - time.monotonic()))
            except queue.Empty:
                message = ("beat", str(beat := beat + 1))
                next_beat = time.monotonic() + HEARTBEAT_SECONDS
            if message is None:
                return
            try:
                store.set(*message)
            except Exception:
                log.warning("could not reach the job's store to publish %s", message[0], exc_info=True)

    # -- the contributors (blocking, in worker threads) -----------------------------------

    def wait_decision(self) -> Decision:
        """The evaluating rank's answer to this rank's next submit. Raises
        :class:`PeerGoneError` once it stopped beating (or closed)."""
        seq = next(self._submits)
        key = f"decision/{seq}"
        decision = _json(key, self._wait_for(key, "its admission decision", alive=True))
        if not (
            isinstance(decision, list) and len(decision) == 3
            and type(decision[0]) is int and isinstance(decision[1], bool)
            and (decision[2] is None or isinstance(decision[2], str))
        ):
            raise _malformed(key, decision, "expected [step, admitted, error]")
        step, admitted, error = decision
        return Decision(step, admitted, error)

    def wait_ready(
        self, step: int, check: Callable[[], None]
    ) -> tuple[str, dict[str, dict[str, int]]] | None:
        """Where to write the shards of ``step``; None if the point left the pipeline first."""
        text = self._wait_for(
            f"ready/{step}", f"the export of step {step}", alive=True, gone=f"settled/{step}", check=check
        )
        if text is None:
            return None
        key = f"ready/{step}"
        ready = _json(key, text)
        if ready is None:
            return None
        staging_dir = self.config.staging_dir
        return checked_ready(key, ready, None if staging_dir is None else os.path.abspath(staging_dir))

    def contributed(self, step: int, error: str | None) -> None:
        self._store.set(f"done/{step}/{self.rank}", error or "ok")

    # -- waiting ---------------------------------------------------------------------------

    def _wait_for(
        self,
        key: str,
        what: str,
        *,
        alive: bool = False,
        gone: str | None = None,
        check: Callable[[], None] | None = None,
        deadline: float | None = None,
    ) -> Any:
        """The value of ``key`` once set. With ``alive``, waits as long as the evaluating rank
        beats; else at most ``collective_timeout`` (or until ``deadline``). None once ``gone``
        is set. Polls (cheap round trips) with a short backoff, so an answer already there
        costs no wait."""
        try:
            return self._poll(key, what, alive, gone, check, deadline)
        except torch.distributed.DistError as exc:
            raise PeerGoneError(f"the job's store did not answer while waiting for {what}: {exc}") from exc

    def _poll(
        self,
        key: str,
        what: str,
        alive: bool,
        gone: str | None,
        check: Callable[[], None] | None,
        deadline: float | None,
    ) -> Any:
        start = time.monotonic()
        limit = start + self.timeout if deadline is None else deadline
        pause = POLL_FIRST_SECONDS
        last_beat: bytes | None = None
        while True:
            if self._store.check([key]):
                value = self._store.get(key)
                try:
                    return value.decode()
                except UnicodeDecodeError:
                    raise _malformed(key, value, "not UTF-8") from None
            if gone is not None and self._store.check([gone]):
                return None
            if check is not None:
                check()
            now = time.monotonic()
            if alive:
                if self._store.check(["closed"]):
                    raise PeerGoneError(f"the evaluating rank {self.eval_rank} closed its supervisor")
                beat = self._store.get("beat") if self._store.check(["beat"]) else None
                if beat != last_beat:
                    last_beat, limit = beat, now + self.timeout
            if now > limit:
                raise PeerGoneError(f"waited {self.timeout:g} s for {what} (collective_timeout)")
            time.sleep(pause)
            pause = min(pause * 2, POLL_MAX_SECONDS)


_HF_DIR_RULE = (
    ". hf_dir must be a path every rank sees: on one node any local path, across nodes a "
    "shared filesystem mounted at the same path"
)


def _own_client(store: Any) -> Any:
    """A connection of its own for a thread that uses the store often (a TCPStore serialises
    the calls of one client)."""
    try:
        return store.clone()
    except Exception:
        return store


class StoreHandover:
    """The evaluating rank's export of one step meeting the contributors (blocking calls,
    from the export thread); see :class:`actorsys.snapshot._sharded.Handover`."""

    def __init__(self, collective: Collective, step: int) -> None:
        self.collective = collective
        self.step = step
        self._since: float | None = None

    def ready(self, directory: str, starts: dict[str, dict[str, int]]) -> None:
        self._since = time.monotonic()
        self.collective._store.set(
            f"ready/{self.step}", json.dumps({"directory": directory, "starts": starts})
        )

    def wait_contributions(self, check: Callable[[], None]) -> None:
        c = self.collective
        deadline = time.monotonic() + c.timeout
        for rank in range(c.world):
            if rank == c.rank:
                continue
            key = f"done/{self.step}/{rank}"
            what = f"rank {rank}'s shards of step {self.step}"
            answer = c._wait_for(key, what, check=check, deadline=deadline)
            c._store.delete_key(key)
            if answer != "ok":
                raise PeerGoneError(f"rank {rank} could not write its shards: {answer}")

    def abandon(self, error: str) -> None:
        if self._since is None:
            try:
                self.collective._store.set(f"ready/{self.step}", json.dumps(None))
            except Exception:
                log.warning("could not tell the other ranks that step %d failed", self.step)


async def decide(
    collective: Collective,
    reserve: Callable[[SubmitRequest], Awaitable[Reservation | None]],
    request: SubmitRequest,
) -> Reservation | None:
    """The evaluating rank's part of a collective submit: its own admission, whose answer
    (admitted, refused, or the error it raised) every other rank's submit then returns."""
    try:
        reservation = await reserve(request)
    except ActorsysError as exc:
        collective.decided(request.step, False, f"{type(exc).__name__}: {exc}")
        raise
    except BaseException:
        collective.decided(request.step, False)
        raise
    collective.decided(request.step, reservation is not None)
    return reservation


class _SettleNotes:
    def __init__(self, sink: Sink, collective: Collective) -> None:
        self._sink = sink
        self._collective = collective

    def record(self, outcome: Outcome) -> None:
        try:
            self._sink.record(outcome)
        finally:
            self._collective.settled(outcome.step)

    def close(self) -> None:
        close = getattr(self._sink, "close", None)
        if callable(close):
            close()


class Contribution:
    """A contributor's side of its supervisor: its answer to each submit (the evaluating
    rank's), and the writes of its shards, one after another, in worker threads.

    ``run`` is a task of the supervisor's nursery; ``aclose`` ends it.
    """

    def __init__(self, collective: Collective, buffers: BufferPool, tracker: ThreadTracker) -> None:
        self.collective = collective
        self.buffers = buffers
        self.tracker = tracker
        self._send, self._receive = trio.open_memory_channel[tuple[int, CapturedWeights]](math.inf)
        self._pending: dict[int, CapturedWeights] = {}
        self._captured: dict[int, CapturedWeights] = {}
        self._changed = trio.Event()
        self._scope = trio.CancelScope()
        self._limiter = trio.CapacityLimiter(1)
        self.closed = False

    async def reserve(self, request: SubmitRequest) -> Reservation | None:
        """This rank's part of a collective submit: the evaluating rank's decision and, if
        this rank holds shards, their copy. None if not admitted.

        The copy of the local shards runs in a worker thread while the decision is on its
        way, when a buffer set is free (it is given back if the point is refused), so the
        control message costs the trainer nothing beyond the copy; the caller's thread waits
        for both. Waits for the decision as long as the evaluating rank is alive (under
        backpressure it waits for a slot); a dead one is a skip after
        ``collective_timeout``. Raises :class:`SubmitError` when the evaluating rank raised,
        or submitted another step. The reservation returned holds no buffers: the copy is
        done, and ``launch`` queues its write.
        """
        if self.closed:
            raise SupervisorClosedError("the supervisor is closed; it admits nothing more")
        step, source = request.step, request.weights_source
        plan, problem = None, None
        try:
            plan = None if source is None else plan_state(source)
        except (TypeError, ValueError) as exc:
            problem = exc
        sharded = plan is not None and plan.sharding is not None
        early = None
        if sharded:
            assert plan is not None
            early = self.buffers.try_lease(plan.buffer_nbytes, pinned=plan.on_cuda)
        copied: list[CapturedWeights | BaseException] = []
        decision: Decision | None = None
        try:
            async with trio.open_nursery() as nursery:
                if early is not None:
                    assert plan is not None
                    nursery.start_soon(self._copy, plan, early, copied)
                decision = await self._decision(step)
        except BaseException:
            self._drop(copied)
            raise
        if decision is None or not decision.admitted or decision.error or decision.step != step:
            self._drop(copied)
            self._refused(step, decision)
            return None
        point = Point(step, Source.WEIGHTS)
        if problem is not None:
            await self._tell(step, f"{type(problem).__name__}: {problem}")
            raise SubmitError(step, str(problem)) from problem
        if not sharded:
            await self._tell(step, None)
            return Reservation(point, 0)
        assert plan is not None
        if not copied:
            lease = await self._lease(plan.buffer_nbytes, plan.on_cuda)
            if lease is None:
                await self._tell(step, f"no free buffer set within {self.collective.timeout:g} s")
                return Reservation(point, 0)
            await self._copy(plan, lease, copied)
        weights = copied[0]
        if isinstance(weights, BaseException):
            await self._tell(step, f"{type(weights).__name__}: {weights}")
            raise SubmitError(step, str(weights)) from weights
        self._captured[step] = weights
        return Reservation(point, plan.nbytes)

    def launch(self, reservation: Reservation, weights: CapturedWeights | None) -> bool:
        """Queue the write of this rank's shards (copied at reserve). Never blocks."""
        step = reservation.point.step
        captured = self._captured.pop(step, None)
        if captured is not None:
            self._pending[step] = captured
            self._send.send_nowait((step, captured))
        return True

    def release(self, reservation: Reservation) -> None:
        step = reservation.point.step
        captured = self._captured.pop(step, None)
        if captured is not None:
            captured.release()
        self._spawn_tell(step, "the submit on this rank was given up")

    async def _decision(self, step: int) -> Decision | None:
        try:
            return await run_blocking(
                self.collective.wait_decision, abandon_on_cancel=True,
                limiter=trio.CapacityLimiter(1), description=f"decision on step {step}",
                tracker=self.tracker,
            )
        except PeerGoneError as exc:
            log.warning("step %s not admitted: %s", step, exc)
            return None

    def _refused(self, step: int, decision: Decision | None) -> None:
        """Not admitted here: raise if the evaluating rank raised or submitted another step;
        a refusal (or a dead evaluating rank) returns."""
        if decision is None or (decision.error is None and decision.step == step):
            return
        eval_rank = self.collective.eval_rank
        if decision.step != step:
            raise SubmitError(
                step, f"the evaluating rank {eval_rank} submitted step {decision.step} here; "
                "every rank submits the same steps in the same order",
            )
        raise SubmitError(step, f"refused by the evaluating rank {eval_rank}: {decision.error}")

    async def _copy(
        self, plan: StatePlan, lease: BufferLease, copied: list[CapturedWeights | BaseException]
    ) -> None:
        """Copy this rank's shards into ``lease`` in a worker thread, waited for even when
        cancelled (the buffer is written until it returns)."""
        try:
            copied.append(await run_blocking(
                lambda: capture_shards(plan, lease), abandon_on_cancel=False,
                limiter=trio.CapacityLimiter(1), description="copy of the local shards",
                tracker=self.tracker,
            ))
        except Exception as exc:
            copied.append(exc)

    @staticmethod
    def _drop(copied: list[CapturedWeights | BaseException]) -> None:
        for weights in copied:
            if isinstance(weights, CapturedWeights):
                weights.release()

    async def run(self) -> None:
        with self._scope:
            async for step, weights in self._receive:
                try:
                    await run_blocking(
                        functools.partial(self._write, step, weights), abandon_on_cancel=True,
                        limiter=self._limiter, description=f"shards of step {step}",
                        tracker=self.tracker,
                    )
                finally:
                    weights.release()
                    self._pending.pop(step, None)
                    self._changed.set()
                    self._changed = trio.Event()

    async def drain(self, timeout: float | None) -> DrainReport:  # noqa: ASYNC109 - a budget
        """Wait until the shards handed over so far are written, for at most ``timeout``."""
        waiting = sorted(self._pending)
        await trio.lowlevel.checkpoint()
        with trio.move_on_after(math.inf if timeout is None else timeout):
            while any(step in self._pending for step in waiting):
                await self._changed.wait()
        pending = [s for s in waiting if s in self._pending]
        return DrainReport(settled=[s for s in waiting if s not in pending], pending=pending)

    async def aclose(self, budget: float) -> list[int]:
        """Stop admitting, let the queued writes finish within ``budget``, abandon the rest
        (their threads stop at their next chunk). Returns the steps abandoned."""
        self.closed = True
        self._send.close()
        report = await self.drain(budget)
        self._scope.cancel()
        for weights in list(self._pending.values()):
            weights.release()
        return report.pending

    def _write(self, step: int, weights: CapturedWeights) -> None:
        c = self.collective
        try:
            with weights.reading():
                ready = c.wait_ready(step, weights.check_live)
                if ready is None:
                    return
                directory, starts = ready
                write_pieces(weights, directory, starts, evaluating=False, check=weights.check_live)
            c.contributed(step, None)
        except Exception as exc:
            log.warning("the shards of step %d were not written: %r", step, exc)
            try:
                c.contributed(step, f"{type(exc).__name__}: {exc}")
            except Exception:
                log.warning("could not reach the job's store", exc_info=True)

    async def _lease(self, nbytes: int, pinned: bool) -> BufferLease | None:
        with trio.move_on_after(self.collective.timeout):
            while True:
                lease = self.buffers.try_lease(nbytes, pinned=pinned)
                if lease is not None:
                    return lease
                await self._changed.wait()
        return None

    async def _tell(self, step: int, error: str | None) -> None:
        await run_blocking(
            lambda: self.collective.contributed(step, error), abandon_on_cancel=True,
            limiter=trio.CapacityLimiter(1), description=f"answer on step {step}", tracker=self.tracker,
        )

    def _spawn_tell(self, step: int, error: str) -> None:
        threading.Thread(
            target=self.collective.contributed, args=(step, error), name="actorsys collective", daemon=True
        ).start()

"""Collective submits: one supervisor per rank of a ``torch.distributed`` job, one pipeline.

In a job of several ranks every rank opens its supervisor with the same config and submits
the same steps in the same order. The rank ``EvalConfig.eval_rank`` (the *evaluating* rank)
runs the pipeline: admission, export, pin, eval, sink. The others (*contributors*) only copy
their local shards of a sharded model and write them into the evaluating rank's snapshot
files (see :func:`actorsys.snapshot.write_pieces`); their supervisors admit nothing and record
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
or trio); the other waits run in worker threads. The messages' formats and checks are in
:mod:`actorsys._core.collective.messages`, the bounded waits on the store in
:mod:`actorsys._core.collective.store`, the evaluating rank's handover of a step and its
sink's settle notes in :mod:`actorsys._core.collective.handover`, the admission answer across
the ranks in :mod:`actorsys._core.collective.admission`, a contributor's side of its supervisor
in :mod:`actorsys._core.collective.contribution`.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import torch

from actorsys import staging
from actorsys._core.collective.handover import SettleNotes, StoreHandover
from actorsys._core.collective.messages import (
    Decision,
    _PeerGoneError,
    checked_ready,
    parse_decision,
    parse_json,
)
from actorsys._core.collective.store import JobStore, Keys, own_client
from actorsys._errors import ConfigError
from actorsys.config import EvalConfig
from actorsys.sinks import Sink

__all__ = ["Collective", "Decision", "StoreHandover", "is_collective_job"]

log = logging.getLogger("actorsys")

HEARTBEAT_SECONDS = 1.0
CHECK_FILE_PREFIX = ".actorsys-ranks-"
_opens = itertools.count()
"""The n-th collective supervisor a process opens meets the n-th of every other rank."""


def is_collective_job() -> bool:
    """Whether this process is one rank of a ``torch.distributed`` job of several ranks."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class Collective:
    """This rank's side of the meeting; build it with :meth:`join` (blocking)."""

    def __init__(self, config: EvalConfig, store: Any, rank: int, world: int) -> None:
        self.config = config
        self.rank = rank
        self.world = world
        self.eval_rank = config.eval_rank
        self.timeout = config.collective_timeout
        self._store = JobStore(store, timeout=self.timeout, eval_rank=self.eval_rank)
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
            self._outbox.put((Keys.CLOSED, "1"))
            self._outbox.put(None)

    def _meet_as_evaluator(self) -> None:
        staging_dir = self.config.staging_dir
        path = None if staging_dir is None else staging.prepare_staging_dir(staging_dir)
        token = uuid.uuid4().hex
        check = None if path is None else os.path.join(path, CHECK_FILE_PREFIX + token)
        if check is not None:
            with open(check, "w", encoding="utf-8") as f:
                f.write(token)
        self._store.set(Keys.OPEN, json.dumps({"token": token, "hf_dir": path}))
        try:
            problems = []
            for rank in range(self.world):
                if rank != self.rank:
                    seen = self._wait_for(Keys.seen(rank), f"rank {rank} to open its supervisor")
                    if seen != "ok":
                        problems.append(seen)
        except _PeerGoneError as exc:
            problems = [str(exc)]
        finally:
            if check is not None:
                os.remove(check)
        verdict = "ok" if not problems else "; ".join(problems) + _HF_DIR_RULE
        self._store.set(Keys.VERDICT, verdict)
        if problems:
            raise ConfigError("hf_dir", verdict)

    def _meet_as_contributor(self) -> None:
        what = f"the evaluating rank {self.eval_rank} to open its supervisor"
        try:
            opened = json.loads(self._wait_for(Keys.OPEN, what))
        except _PeerGoneError as exc:
            raise ConfigError("eval_rank", f"{exc}; every rank opens one with the same config") from exc
        self._store.set(Keys.seen(self.rank), self._check_hf_dir(opened))
        try:
            verdict = self._wait_for(Keys.VERDICT, what)
        except _PeerGoneError as exc:
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
        self._outbox.put((Keys.decision(seq), json.dumps([step, admitted, error], default=repr)))

    def settled(self, step: int) -> None:
        """The point of ``step`` left the pipeline (or was never launched). Never blocks."""
        self._outbox.put((Keys.settled(step), "1"))

    def handover(self, step: int) -> StoreHandover:
        return StoreHandover(self._store, step, rank=self.rank, world=self.world)

    def observe(self, sink: Sink) -> Sink:
        """``sink``, and every outcome it records noted as settled for the other ranks."""
        return SettleNotes(sink, self.settled)

    def _send_messages(self) -> None:
        store = own_client(self._store.raw)
        beat = 0
        next_beat = time.monotonic()
        while True:
            try:
                message = self._outbox.get(timeout=max(0.0, next_beat - time.monotonic()))
            except queue.Empty:
                message = (Keys.BEAT, str(beat := beat + 1))
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
        :class:`_PeerGoneError` once it stopped beating (or closed)."""
        seq = next(self._submits)
        key = Keys.decision(seq)
        return parse_decision(key, self._wait_for(key, "its admission decision", alive=True))

    def wait_ready(
        self, step: int, check: Callable[[], None]
    ) -> tuple[str, dict[str, dict[str, int]]] | None:
        """Where to write the shards of ``step``; None if the point left the pipeline first."""
        text = self._wait_for(
            Keys.ready(step), f"the export of step {step}", alive=True, gone=Keys.settled(step), check=check
        )
        if text is None:
            return None
        key = Keys.ready(step)
        ready = parse_json(key, text)
        if ready is None:
            return None
        staging_dir = self.config.staging_dir
        return checked_ready(key, ready, None if staging_dir is None else os.path.abspath(staging_dir))

    def contributed(self, step: int, error: str | None) -> None:
        self._store.set(Keys.done(step, self.rank), error or "ok")

    # -- waiting ---------------------------------------------------------------------------

    def _wait_for(self, key: str, what: str, **how: Any) -> Any:
        """:meth:`JobStore.wait_for` on this job's store."""
        return self._store.wait_for(key, what, **how)


_HF_DIR_RULE = (
    ". hf_dir must be a path every rank sees: on one node any local path, across nodes a "
    "shared filesystem mounted at the same path"
)

"""Waiting on a ``torch.distributed`` job's key-value store, for the ranks of a collective
(:mod:`actorsys._core.collective.protocol`): a poll of cheap round trips with a short backoff, so an
answer already there costs no wait, bounded by ``collective_timeout`` or, while the evaluating
rank beats, by its heartbeat. Blocking: called from worker threads.

This module is also the one place the keys of the meeting are spelled (:class:`Keys`), and
:class:`JobStore`, the store as the ranks' protocol and the evaluating rank's handover use it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from actorsys._core.collective.messages import _PeerGoneError, malformed

__all__ = ["POLL_FIRST_SECONDS", "POLL_MAX_SECONDS", "JobStore", "Keys", "own_client", "wait_for"]

POLL_FIRST_SECONDS = 0.0005
POLL_MAX_SECONDS = 0.002


class Keys:
    """The keys the ranks of a collective leave in the job's store (the protocol's docstring,
    :mod:`actorsys._core.collective.protocol`, says what each holds)."""

    OPEN = "open"
    VERDICT = "verdict"
    BEAT = "beat"
    CLOSED = "closed"

    @staticmethod
    def seen(rank: int) -> str:
        return f"seen/{rank}"

    @staticmethod
    def decision(seq: int) -> str:
        return f"decision/{seq}"

    @staticmethod
    def ready(step: int) -> str:
        return f"ready/{step}"

    @staticmethod
    def done(step: int, rank: int) -> str:
        return f"done/{step}/{rank}"

    @staticmethod
    def settled(step: int) -> str:
        return f"settled/{step}"


class JobStore:
    """The job's key-value store as one rank of a collective uses it: set, delete and wait for
    a key (:func:`wait_for`, bounded by ``timeout`` or the heartbeat of ``eval_rank``).
    Blocking: called from worker threads."""

    def __init__(self, store: Any, *, timeout: float, eval_rank: int) -> None:
        self.raw = store
        self.timeout = timeout
        self.eval_rank = eval_rank

    def set(self, key: str, value: str) -> None:
        self.raw.set(key, value)

    def delete(self, key: str) -> None:
        self.raw.delete_key(key)

    def wait_for(self, key: str, what: str, **how: Any) -> Any:
        """:func:`wait_for` on this store."""
        return wait_for(self.raw, key, what, timeout=self.timeout, eval_rank=self.eval_rank, **how)


def wait_for(
    store: Any,
    key: str,
    what: str,
    *,
    timeout: float,
    eval_rank: int,
    alive: bool = False,
    gone: str | None = None,
    check: Callable[[], None] | None = None,
    deadline: float | None = None,
) -> Any:
    """The value of ``key`` once set. With ``alive``, waits as long as the evaluating rank
    (``eval_rank``) beats; else at most ``timeout`` seconds (or until ``deadline``). None once
    ``gone`` is set. Raises :class:`_PeerGoneError` when the wait runs out or the store does not
    answer."""
    try:
        return _poll(store, key, what, timeout, eval_rank, alive, gone, check, deadline)
    except torch.distributed.DistError as exc:
        raise _PeerGoneError(f"the job's store did not answer while waiting for {what}: {exc}") from exc


def _poll(
    store: Any,
    key: str,
    what: str,
    timeout: float,
    eval_rank: int,
    alive: bool,
    gone: str | None,
    check: Callable[[], None] | None,
    deadline: float | None,
) -> Any:
    start = time.monotonic()
    limit = start + timeout if deadline is None else deadline
    pause = POLL_FIRST_SECONDS
    last_beat: bytes | None = None
    while True:
        if store.check([key]):
            value = store.get(key)
            try:
                return value.decode()
            except UnicodeDecodeError:
                raise malformed(key, value, "not UTF-8") from None
        if gone is not None and store.check([gone]):
            return None
        if check is not None:
            check()
        now = time.monotonic()
        if alive:
            if store.check([Keys.CLOSED]):
                raise _PeerGoneError(f"the evaluating rank {eval_rank} closed its supervisor")
            beat = store.get(Keys.BEAT) if store.check([Keys.BEAT]) else None
            if beat != last_beat:
                last_beat, limit = beat, now + timeout
        if now > limit:
            raise _PeerGoneError(f"waited {timeout:g} s for {what} (collective_timeout)")
        time.sleep(pause)
        pause = min(pause * 2, POLL_MAX_SECONDS)


def own_client(store: Any) -> Any:
    """A connection of its own for a thread that uses the store often (a TCPStore serialises
    the calls of one client)."""
    try:
        return store.clone()
    except Exception:
        return store

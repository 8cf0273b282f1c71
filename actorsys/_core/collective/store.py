"""Waiting on a ``torch.distributed`` job's key-value store, for the ranks of a collective
(:mod:`actorsys._core.collective.protocol`): a poll of cheap round trips with a short backoff, so an
answer already there costs no wait, bounded by ``collective_timeout`` or, while the evaluating
rank beats, by its heartbeat. Blocking: called from worker threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from actorsys._core.collective.messages import PeerGoneError, malformed

__all__ = ["POLL_FIRST_SECONDS", "POLL_MAX_SECONDS", "own_client", "wait_for"]

POLL_FIRST_SECONDS = 0.0005
POLL_MAX_SECONDS = 0.002


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
    ``gone`` is set. Raises :class:`PeerGoneError` when the wait runs out or the store does not
    answer."""
    try:
        return _poll(store, key, what, timeout, eval_rank, alive, gone, check, deadline)
    except torch.distributed.DistError as exc:
        raise PeerGoneError(f"the job's store did not answer while waiting for {what}: {exc}") from exc


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
            if store.check(["closed"]):
                raise PeerGoneError(f"the evaluating rank {eval_rank} closed its supervisor")
            beat = store.get("beat") if store.check(["beat"]) else None
            if beat != last_beat:
                last_beat, limit = beat, now + timeout
        if now > limit:
            raise PeerGoneError(f"waited {timeout:g} s for {what} (collective_timeout)")
        time.sleep(pause)
        pause = min(pause * 2, POLL_MAX_SECONDS)


def own_client(store: Any) -> Any:
    """A connection of its own for a thread that uses the store often (a TCPStore serialises
    the calls of one client)."""
    try:
        return store.clone()
    except Exception:
        return store

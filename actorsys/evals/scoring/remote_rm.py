"""``remote_rm``: an answer graded by a reward server (a reward model, a judge) at a dataset's
``rm_url``, as miles' ``--rm-type remote_rm --rm-url URL`` does.

The scoring worker POSTs ``{"prompt", "response", "label", "metadata"}`` as JSON (``prompt`` is
the prompt the model was given: the rendered chat prompt for a chat dataset) and takes the
reply's number: the body itself (``0.75``) or its ``reward`` (``{"reward": 0.75}``). A reward
is taken as the server gives it (a reward model's score need not lie in [0, 1]; pass@k counts
a sample correct at 1 or more).

A reward server is not ours, and what it sends is bounded here:

- one deadline covers the whole call (connecting, sending, and the reply's every byte): a
  reply that trickles in a byte at a time, each within any per-read timeout, is cut at the
  deadline. The deadline is :data:`REPLY_SHARE` of the answer's ``score_timeout``, so the
  worker reports the error itself and scores on, before the pool would kill it at
  ``score_timeout`` (a killed worker must be started and warmed again);
- the reply is read streamed and at most :data:`MAX_REPLY_BYTES` of it (a larger declared
  length is refused before its body is read), sent uncompressed (``Accept-Encoding:
  identity``), so a reply of gigabytes never lands in the worker's memory.

A connection error, an error status, a reply past the deadline or the cap, a malformed or
non-finite reply raises :class:`RemoteRewardError`, which the evaluation scores 0 and counts
in ``eval/<name>/scorer_errors``. Blocking: it runs in the scoring workers, which have no
event loop, so its client is :func:`actorsys._http.sync_client`'s.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import httpx

from actorsys._errors import RemoteRewardError
from actorsys._http import sync_client

MAX_REPLY_BYTES = 1024 * 1024
"""The largest reply read from a reward server (a reward is a number: a few bytes)."""
REPLY_SHARE = 0.9
"""The share of an answer's ``score_timeout`` its reward call may take, from connecting to
the reply's last byte; the rest is the worker's margin to report the error before the pool
kills it."""


def remote_reward(
    url: str,
    *,
    prompt: str,
    response: str,
    label: Any,
    metadata: Mapping[str, Any] | None,
    timeout: float,
) -> float:
    """The reward the server at ``url`` gives ``response``, the whole call within
    :data:`REPLY_SHARE` of ``timeout`` (the answer's ``score_timeout``) and its reply within
    :data:`MAX_REPLY_BYTES`; raises :class:`RemoteRewardError`. Blocks the calling thread
    for at most that long."""
    payload = {"prompt": prompt, "response": response, "label": label,
               "metadata": dict(metadata or {})}
    budget = timeout * REPLY_SHARE
    deadline = time.monotonic() + budget
    late = RemoteRewardError(f"reward server {url}: no whole answer within {budget:.3g} s")
    try:
        with _cut_at(deadline) as trace, sync_client(timeout=budget) as client:
            with client.stream("POST", url, json=payload, headers={"accept-encoding": "identity"},
                               extensions={"trace": trace}) as reply:
                body = _read_capped(url, reply, deadline, late)
    except httpx.HTTPError as exc:
        if time.monotonic() >= deadline or isinstance(exc, httpx.TimeoutException):
            raise late from None
        raise RemoteRewardError(f"reward server {url}: {type(exc).__name__}: {exc}") from None
    text = body.decode("utf-8", "replace")
    if reply.status_code != 200:
        raise RemoteRewardError(f"reward server {url} answered HTTP {reply.status_code}: {text[:200]}")
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        raise RemoteRewardError(f"reward server {url} answered no JSON: {text[:200]}") from None
    return reward_of(url, parsed)


def _read_capped(url: str, reply: httpx.Response, deadline: float,
                 late: RemoteRewardError) -> bytes:
    """The body of ``reply``, read until its end, :data:`MAX_REPLY_BYTES` or ``deadline``."""
    declared = reply.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_REPLY_BYTES:
        raise RemoteRewardError(
            f"reward server {url} declared a reply of {declared} bytes; at most "
            f"{MAX_REPLY_BYTES} are read")
    data = bytearray()
    for chunk in reply.iter_bytes():
        data += chunk
        if len(data) > MAX_REPLY_BYTES:
            raise RemoteRewardError(
                f"reward server {url} sent a reply over {MAX_REPLY_BYTES} bytes; stopped reading")
        if time.monotonic() >= deadline:
            raise late
    return bytes(data)


@contextlib.contextmanager
def _cut_at(deadline: float) -> Iterator[Any]:
    """An httpcore ``trace`` extension that arms a timer on the call's connection: at
    ``deadline`` it shuts the socket down, which wakes a read blocked on it (a per-read
    timeout alone restarts with every byte that arrives). The timer is disarmed on exit."""
    timers: list[threading.Timer] = []

    def trace(event: str, info: Mapping[str, Any]) -> None:
        if event != "connection.connect_tcp.complete":
            return
        sock = info["return_value"].get_extra_info("socket")
        if sock is None:
            return

        def shut() -> None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(max(0.0, deadline - time.monotonic()), shut)
        timer.daemon = True
        timers.append(timer)
        timer.start()

    try:
        yield trace
    finally:
        for timer in timers:
            timer.cancel()


def reward_of(url: str, body: Any) -> float:
    """The reward in a reply body: a number, or an object's ``reward``."""
    value = body.get("reward") if isinstance(body, Mapping) else body
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise RemoteRewardError(
            f"reward server {url} answered {json.dumps(body)[:200]}; expected a finite number "
            'or {"reward": <number>}'
        )
    return float(value)

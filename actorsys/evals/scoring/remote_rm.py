"""``remote_rm``: an answer graded by a reward server (a reward model, a judge) at a dataset's
``rm_url``, as miles' ``--rm-type remote_rm --rm-url URL`` does.

The scoring worker POSTs ``{"prompt", "response", "label", "metadata"}`` as JSON (``prompt`` is
the prompt the model was given: the rendered chat prompt for a chat dataset) and takes the
reply's number: the body itself (``0.75``) or its ``reward`` (``{"reward": 0.75}``). A reward
is taken as the server gives it (a reward model's score need not lie in [0, 1]; pass@k counts
a sample correct at 1 or more). Every request is bounded by the dataset's ``score_timeout``
(and the worker is killed past it); a connection error, an error status, a malformed or
non-finite reply raises :class:`RemoteRewardError`, which the evaluation scores 0 and counts
in ``eval/<name>/scorer_errors``. Blocking: it runs in the scoring workers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import httpx

from actorsys._errors import RemoteRewardError
from actorsys._http import ssl_context


def remote_reward(
    url: str,
    *,
    prompt: str,
    response: str,
    label: Any,
    metadata: Mapping[str, Any] | None,
    timeout: float,
) -> float:
    """The reward the server at ``url`` gives ``response``; raises :class:`RemoteRewardError`."""
    payload = {"prompt": prompt, "response": response, "label": label,
               "metadata": dict(metadata or {})}
    try:
        with httpx.Client(timeout=timeout, verify=ssl_context()) as client:
            reply = client.post(url, json=payload)
    except httpx.TimeoutException:
        raise RemoteRewardError(f"reward server {url}: no answer within {timeout} s") from None
    except httpx.HTTPError as exc:
        raise RemoteRewardError(f"reward server {url}: {type(exc).__name__}: {exc}") from None
    if reply.status_code != 200:
        raise RemoteRewardError(
            f"reward server {url} answered HTTP {reply.status_code}: {reply.text[:200]}"
        )
    try:
        body = reply.json()
    except (ValueError, json.JSONDecodeError):
        raise RemoteRewardError(f"reward server {url} answered no JSON: {reply.text[:200]}") from None
    return reward_of(url, body)


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

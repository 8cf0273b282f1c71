"""The ``priority`` an evaluation's requests carry, per engine, so that the trainer's own
requests (its rollouts) keep their place in the engine's queue.

``Fleet(engines, eval_priority=N)``: ``N >= 0`` is how far behind a trainer's request of the
engine's default priority an evaluation's requests queue (0: level with it, first come, first
served). The engines order the other way round from each other, so ``N`` is translated per
engine; what each one does with the value was read in its sources:

vLLM (``--scheduling-policy priority``)
    ``vllm/config/scheduler.py``, ``SchedulerConfig.policy``: *"priority" means requests are
    handled based on given priority (lower value means earlier handling) and time of arrival
    deciding any ties*; ``vllm/v1/core/sched/request_queue.py``, ``PriorityRequestQueue``:
    *requests with a smaller value of `priority` are processed first*; the request's field
    (``vllm/entrypoints/openai/completion/protocol.py``): ``priority: int = 0``. A rollout sent
    without a priority is 0, so an evaluation's request is sent ``N``. Under memory pressure
    the scheduler preempts the running request of the largest ``(priority, arrival_time)``
    (``vllm/v1/core/sched/scheduler.py``): an evaluation's before a rollout, and preempted
    requests are computed again, never aborted. Under ``fcfs`` the 0.32 scheduler carries the
    value unused; the field's description warns that older servers refuse a priority other than
    0 without priority scheduling, so set ``eval_priority`` only for engines started with it.

sglang (``--enable-priority-scheduling``)
    ``python/sglang/srt/server_args.py``: *requests with higher priority integer values are
    scheduled first by default*; ``--schedule-low-priority-values-first`` turns it round, and
    ``--default-priority-value`` is what a request without one gets. Without that default,
    ``Scheduler._set_or_validate_priority`` (``python/sglang/srt/managers/scheduler.py``) puts a
    request without a priority *last*: ``-sys.maxsize - 1`` by default, ``sys.maxsize`` with
    low values first. So an evaluation's request is sent the rollouts' default moved ``N``
    towards the back (``default - N``; ``default + N`` with low values first), held within the
    last place: where the rollouts' default is the last place itself, evaluations queue level
    with them (ties go by arrival, so no rollout already queued is overtaken). A server without
    priority scheduling is sent no priority: it ignores one, or with
    ``--abort-on-priority-when-disabled`` aborts the request. The three settings are read from
    the server's ``/get_server_info`` (``/server_info``), its arguments as it runs them.

The embedded engine (ours) speaks sglang's API and reports itself as priority-scheduled with low
values first and a default of 0 (:mod:`actorsys.fleet.embedded.batching` orders its queue so),
so it is sent ``N``, as vLLM is.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import anyio
import httpx

from actorsys import _http

__all__ = ["engine_flavor", "eval_priorities", "sglang_priority", "vllm_priority"]

log = logging.getLogger("actorsys.fleet")

SGLANG_LAST_HIGH_FIRST = -(2**63)
"""Where sglang puts a request without a priority when high values go first."""
SGLANG_LAST_LOW_FIRST = 2**63 - 1
"""... and when low values go first."""
SERVER_INFO_PATHS = ("/get_server_info", "/server_info")
INFO_TIMEOUT = 10.0

PriorityFlavor = Literal["vllm", "sglang"]


def vllm_priority(eval_priority: int) -> int:
    """What a vLLM server is sent: lower goes first, and a rollout without one is 0."""
    return eval_priority


def sglang_priority(eval_priority: int, server_info: Mapping[str, Any]) -> int | None:
    """What an sglang server whose arguments are ``server_info`` is sent (None: no priority,
    the server does not schedule by it)."""
    if server_info.get("enable_priority_scheduling") is not True:
        return None
    low_first = server_info.get("schedule_low_priority_values_first") is True
    last = SGLANG_LAST_LOW_FIRST if low_first else SGLANG_LAST_HIGH_FIRST
    default = server_info.get("default_priority_value")
    if isinstance(default, bool) or not isinstance(default, int):
        default = last
    if low_first:
        return min(default + eval_priority, last)
    return max(default - eval_priority, last)


def engine_flavor(engine: object) -> PriorityFlavor | None:
    """Which way ``engine`` orders priorities: its client's ``flavor`` (``SGLangEngine``,
    ``VLLMEngine``), or the kind of engine a local or Ray fleet started (the embedded engine
    speaks sglang's API); None where it cannot be told."""
    for candidate in (engine, getattr(engine, "client", None)):
        flavor = getattr(candidate, "flavor", None)
        if flavor in ("vllm", "sglang"):
            return flavor
    spec = getattr(engine, "spec", None)
    kind = getattr(spec, "kind", None)
    if kind == "vllm":
        return "vllm"
    if kind in ("embedded", "sglang"):
        return "sglang"
    return None


async def eval_priorities(
    engines: Sequence[object],
    eval_priority: int,
    *,
    api_key: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> dict[str, int]:
    """The ``priority`` to send each engine of ``engines`` (by its base URL; an engine left
    out is sent none: it has no URL yet, its flavor cannot be told, or it does not schedule
    by priority). Blocks on one ``/get_server_info`` per sglang engine, each bounded by
    :data:`INFO_TIMEOUT`; the caller's cancel scope bounds the whole."""
    priorities: dict[str, int] = {}
    async with _http.client(api_key=api_key, timeout=INFO_TIMEOUT, transport=transport) as client:
        for engine in engines:
            url = getattr(engine, "url", None)
            flavor = engine_flavor(engine)
            if not url:
                continue
            url = url.rstrip("/")
            priority: int | None = None
            if flavor == "vllm":
                priority = vllm_priority(eval_priority)
            elif flavor == "sglang":
                info = await server_info(client, url)
                priority = None if info is None else sglang_priority(eval_priority, info)
            else:
                log.warning("cannot tell which way %r orders priorities; its evaluation "
                            "requests carry none", engine)
            if priority is not None:
                priorities[url] = priority
    return priorities


async def server_info(client: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
    """The arguments the sglang server at ``url`` runs with, or None where it answers none."""
    for path in SERVER_INFO_PATHS:
        with anyio.move_on_after(INFO_TIMEOUT):
            try:
                response = await client.get(f"{url}{path}")
                body = response.json() if response.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                body = None
            if isinstance(body, dict):
                return body
    log.warning("%s answers no server info; its evaluation requests carry no priority", url)
    return None

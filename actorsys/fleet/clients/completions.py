"""Completions for eval fns: bounded concurrency, a deadline per request, a version check.

An eval fn runs on a pinned fleet; ``await input.fleet.complete(prompts)`` sends one
OpenAI-style ``/v1/completions`` request per prompt (text, or token ids: a chat prompt rendered
by its template goes as ids, which vLLM, sglang and the CPU engine take as they are, adding no
BOS of their own) to the fleet's router (or round-robin over
its engines) and returns the answers in prompt order. Engines that report the version of the
weights behind an answer (sglang's ``metadata.weight_version``, the embedded engine) are held
to the pinned version: a stale answer fails the evaluation as ``pin_violation``, because a
score mixing two checkpoints is worse than no score.

Written on anyio, so it runs in eval fns with ``runtime="trio"`` and ``runtime="asyncio"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from actorsys import _http
from actorsys._errors import BadRequestError, CompletionError, ConfigError, ConfigTypeError, StaleWeightsError
from actorsys._flags import require_int, require_seconds
from actorsys._http import RETRY_INITIAL_DELAY, RETRY_MAX_DELAY, Backoff  # noqa: F401 - their home before

TRANSIENT_CLIENT_STATUSES = frozenset({408, 429})
"""4xx answers that say "not now" rather than "never": retried like a 5xx."""


@dataclass(frozen=True)
class Completion:
    """One answer. ``weight_version`` is what the engine reported, None where it reports none;
    ``completion_tokens`` the answer's length in tokens where the engine reports usage.
    ``error`` is set (and ``text`` empty) for a request that failed, when failures are kept;
    ``bad_request`` then says the server refused the request itself (a 4xx), so it would fail
    again."""

    index: int
    prompt: str | list[int]
    text: str
    finish_reason: str | None
    weight_version: str | None
    url: str
    completion_tokens: int | None = None
    error: str | None = None
    bad_request: bool = False


async def complete(
    targets: Sequence[str],
    prompts: Sequence[str | Sequence[int]],
    *,
    expected_version: str | None = None,
    max_tokens: int | Sequence[int] = 64,
    temperature: float = 0.0,
    concurrency: int = 8,
    request_timeout: float = 60.0,
    model: str | None = None,
    api_key: str | None = None,
    extra: Mapping[str, Any] | None = None,
    retries: int = 0,
    keep_failures: bool = False,
    priorities: Mapping[str, int] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[Completion]:
    """Complete ``prompts`` (each a string, or a sequence of token ids sent as they are) on
    the servers at ``targets`` (prompt ``i`` goes to
    ``targets[i % len(targets)]``); return the answers in prompt order.

    At most ``concurrency`` requests are in flight; each must be answered within
    ``request_timeout`` seconds. The first failure cancels the other requests and raises
    :class:`CompletionError` (or :class:`StaleWeightsError` when ``expected_version`` is given
    and an engine reports another one). ``model`` defaults to the first id the first target
    lists in ``/v1/models`` (a router needs one). ``max_tokens`` is one limit for every prompt,
    or one per prompt. ``extra`` is merged into every request body (e.g.
    ``{"seed": 0, "top_p": 0.9}``). ``priorities``: the ``priority`` each target (by its
    URL) is sent with every request (:mod:`actorsys.fleet.clients.priority`); a target left
    out is sent none.

    A request that fails (no answer in time, a connection error, a 5xx, a malformed body) is
    sent again up to ``retries`` times, each time to the next target, after a short backoff
    (so is a 408 or 429); a request the server refused (another 4xx) is not retried: it fails
    as :class:`BadRequestError`. With ``keep_failures``, a request
    that still fails comes back as a :class:`Completion` with ``error`` set instead of failing
    the call; a stale version always fails it. Blocks until every answer is in; cancelling it
    closes the open connections.
    """
    if not targets:
        raise ConfigError("complete(targets)", "at least one server URL is required")
    if isinstance(prompts, str):
        raise ConfigTypeError("complete(prompts)", "pass a sequence of strings, not one string")
    payloads = [prompt_payload(index, prompt) for index, prompt in enumerate(prompts)]
    require_int("complete(concurrency)", concurrency, minimum=1)
    require_int("complete(retries)", retries, minimum=0)
    require_seconds("complete(request_timeout)", request_timeout)
    limits = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    if len(limits) != len(prompts):
        raise ConfigError(
            "complete(max_tokens)", f"expected one limit per prompt ({len(prompts)}), got {len(limits)}"
        )
    priority_of = {url.rstrip("/"): value for url, value in (priorities or {}).items()}
    results: list[Completion | None] = [None] * len(prompts)
    failure: list[CompletionError] = []
    limiter = anyio.Semaphore(concurrency)

    async with _http.client(
        api_key=api_key,
        timeout=request_timeout,
        transport=transport,
        limits=httpx.Limits(max_connections=concurrency),
    ) as client:
        if model is None:
            with anyio.move_on_after(request_timeout):
                model = await served_model(client, targets[0].rstrip("/"))
        bodies = [
            {
                **({"model": model} if model is not None else {}),
                "prompt": prompt,
                "max_tokens": limit,
                "temperature": temperature,
                **(extra or {}),
            }
            for prompt, limit in zip(payloads, limits, strict=True)
        ]

        async def attempt(index: int, url: str) -> Completion:
            try:
                body = bodies[index]
                if url in priority_of:
                    body = {**body, "priority": priority_of[url]}
                with anyio.fail_after(request_timeout):
                    answer = await _request(client, url, index, body)
            except TimeoutError:
                raise CompletionError(url, index, f"no answer within {request_timeout} s") from None
            if (
                expected_version is not None
                and answer.weight_version is not None
                and answer.weight_version != expected_version
            ):
                raise StaleWeightsError(url, index, expected_version, answer.weight_version)
            return answer

        async def one(index: int, task_group: anyio.abc.TaskGroup) -> None:
            async with limiter:
                async for tried in Backoff():
                    url = targets[(index + tried - 1) % len(targets)].rstrip("/")
                    try:
                        results[index] = await attempt(index, url)
                        return
                    except CompletionError as exc:
                        error = exc
                    if not error.retryable or tried > retries:
                        break
            if keep_failures and not isinstance(error, StaleWeightsError):
                prompt = bodies[index]["prompt"]
                results[index] = Completion(
                    index, prompt, "", None, None, error.url, error=str(error),
                    bad_request=isinstance(error, BadRequestError),
                )
                return
            failure.append(error)
            task_group.cancel_scope.cancel()

        async with anyio.create_task_group() as task_group:
            for index in range(len(bodies)):
                task_group.start_soon(one, index, task_group)
    if failure:
        raise failure[0]
    return [answer for answer in results if answer is not None]


def prompt_payload(index: int, prompt: object) -> str | list[int]:
    """A prompt as a request carries it: a string, or a non-empty list of token ids."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and prompt and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in prompt
    ):
        return [int(i) for i in prompt]
    raise ConfigTypeError(
        f"complete(prompts[{index}])",
        "expected a string or a non-empty sequence of token ids (non-negative integers)",
    )


async def served_model(client: httpx.AsyncClient, url: str) -> str | None:
    """The first model id the server at ``url`` lists (vLLM answers only requests that name
    it); None where it lists none or cannot say."""
    try:
        response = await client.get(f"{url}/v1/models")
        model = response.json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None
    return model if isinstance(model, str) else None


async def _request(
    client: httpx.AsyncClient, url: str, index: int, body: dict[str, Any]
) -> Completion:
    try:
        response = await client.post(f"{url}/v1/completions", json=body)
    except httpx.TimeoutException:
        raise TimeoutError from None
    except httpx.HTTPError as exc:
        raise CompletionError(url, index, f"request failed: {exc!r}") from exc
    if response.status_code != 200:
        status = response.status_code
        message = f"HTTP {status}: {response.text[:300]}"
        if 400 <= status < 500 and status not in TRANSIENT_CLIENT_STATUSES:
            raise BadRequestError(url, index, message)
        raise CompletionError(url, index, message, retryable=status >= 400)
    try:
        payload = response.json()
        choice = payload["choices"][0]
        text = choice["text"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        message = f"malformed completion body: {response.text[:300]}"
        raise CompletionError(url, index, message) from exc
    metadata = payload.get("metadata")
    version = metadata.get("weight_version") if isinstance(metadata, dict) else None
    usage = payload.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return Completion(
        index=index,
        prompt=body["prompt"],
        text=text,
        finish_reason=choice.get("finish_reason"),
        weight_version=None if version is None else str(version),
        url=url,
        completion_tokens=tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None,
    )

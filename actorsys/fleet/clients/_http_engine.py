"""What every engine client reached over HTTP shares: requests with a timeout, an optional API
key, and retries while a server is busy reloading.

An engine keeps one ``httpx.AsyncClient`` (built by :mod:`actorsys._http`) per trio run, so
its requests reuse their connections; a call cancelled mid-request (the pin deadline, close)
closes that request's connection, and an engine used from a new trio run builds a new
client. Retrying never ends by itself: the caller's cancel scope (``pin_timeout``) is the
deadline, as for every coroutine here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import trio

from actorsys import _http
from actorsys._errors import ConfigError
from actorsys._http import RETRY_INITIAL_DELAY, RETRY_MAX_DELAY, Backoff  # noqa: F401 - their home before
from actorsys.config import require_seconds
from actorsys.fleet.fleet import EngineUnhealthyError
from actorsys.fleet.on_all import EngineUnauthorizedError
from actorsys.fleet.pin.probe import ProbeUnsupportedError

log = logging.getLogger("actorsys.fleet")



def check_url(url: object, owner: str) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(f"{owner}(url)", f"expected an http:// or https:// URL, got {url!r}")
    return url.rstrip("/")


class HttpEngine:
    """Base of the HTTP engine clients.

    ``request_timeout`` bounds every request but loads, which get ``load_timeout`` (a reload of
    a large model takes minutes). ``api_key``, sent as a bearer token, is also what the fleet's
    completions and the weight probe send. ``transport`` replaces the network, for tests.
    """

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        api_key: str | None = None,
        request_timeout: float = 30.0,
        load_timeout: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        owner = type(self).__name__
        self.url = check_url(url, owner)
        self.name = name if name is not None else self.url
        self.request_timeout = require_seconds(f"{owner}(request_timeout)", request_timeout)
        self.load_timeout = require_seconds(f"{owner}(load_timeout)", load_timeout)
        self.api_key = api_key or None
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._client_run: object = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    async def _send(
        self,
        method: str,
        path: str,
        *,
        seconds: float,
        json: Any = None,
        params: dict[str, str] | None = None,
    ) -> httpx.Response:
        """One request that must be answered within ``seconds`` in all (httpx's own timeouts
        bound each read or write, not the whole exchange); raises ``httpx.TransportError``,
        ``httpx.TimeoutException`` included, and :class:`EngineUnauthorizedError` for a 401
        or 403 (the key is wrong or missing: never worth a retry)."""
        with trio.move_on_after(seconds):
            response = await self.client().request(
                method, path, json=json, params=params, timeout=seconds
            )
            return _http.check_authorized(self.name, method, path, response, self.api_key)
        raise httpx.ReadTimeout(f"{method} {self.url}{path}: no answer within {seconds} s")

    def client(self) -> httpx.AsyncClient:
        """This engine's one client in the current trio run (built on first use in each run:
        a client's connections belong to the run that opened them)."""
        run = trio.lowlevel.current_trio_token()
        if self._client is None or self._client_run is not run:
            self._client = _http.client(
                base_url=self.url, api_key=self.api_key, timeout=self.request_timeout,
                transport=self._transport,
            )
            self._client_run = run
        return self._client

    async def aclose(self) -> None:
        """Close this engine's client and its connections (a later request opens new ones)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def _unauthorized(
        self, method: str, path: str, response: httpx.Response
    ) -> EngineUnauthorizedError:
        return _http.unauthorized(self.name, method, path, response, self.api_key)

    async def _probe(self, path: str) -> httpx.Response:
        """GET for a health check. A refused or broken connection raises
        :class:`EngineUnhealthyError` at once (the process is gone); a request that times out
        is sent again, since a stopped or overloaded process accepts connections but does not
        answer: a hang, for the caller's deadline to judge."""
        async for _ in Backoff():
            try:
                return await self._send("GET", path, seconds=self.request_timeout)
            except httpx.TimeoutException as exc:
                log.info("%s: GET %s timed out (%r); retrying", self.name, path, exc)
            except httpx.TransportError as exc:
                raise EngineUnhealthyError(self.name, f"GET {path} failed: {exc!r}") from exc
        raise AssertionError("unreachable: Backoff never ends")

    async def _token_probe(
        self, path: str, body: dict[str, Any], token_lists: Callable[[Any], list[Any]]
    ) -> list[list[int]]:
        """The weight probe's request: ``POST path`` with ``body``; ``token_lists`` takes the
        token id lists out of the answer. Raises
        :class:`~actorsys.fleet.pin.probe.ProbeUnsupportedError` if the server has no such
        endpoint or answers no token ids, :class:`EngineUnhealthyError` for an error status."""
        response = await self._until_answered("POST", path, json=body)
        if response.status_code == 404:
            raise ProbeUnsupportedError(f"it has no POST {path}")
        if response.status_code != 200:
            raise self._unexpected("POST", path, response)
        try:
            return [[int(t) for t in tokens] for tokens in token_lists(response.json())]
        except (ValueError, KeyError, TypeError) as exc:
            raise ProbeUnsupportedError(f"POST {path} answered no token ids: {exc!r}") from exc

    async def _prefill_probe(
        self, sequences: Sequence[Sequence[int]], *, max_tokens: int
    ) -> list[list[float]]:
        """The prefill probe's request: ``POST /v1/completions`` with the sequences as token
        ids, ``echo`` and ``logprobs``, generating ``max_tokens`` (0 where the server allows
        it); each sequence's ``token_logprobs`` after its first token. Raises
        :class:`~actorsys.fleet.pin.probe.ProbeUnsupportedError` for a 4xx or an answer without
        them (the probe then asks for greedy tokens), :class:`EngineUnhealthyError` for
        another error status."""
        body = {"prompt": [list(s) for s in sequences], "max_tokens": max_tokens, "echo": True,
                "logprobs": 1, "temperature": 0.0}
        response = await self._until_answered("POST", "/v1/completions", json=body)
        if 400 <= response.status_code < 500:
            raise ProbeUnsupportedError(
                f"POST /v1/completions with echo and logprobs answered HTTP "
                f"{response.status_code}: {response.text[:200]}"
            )
        if response.status_code != 200:
            raise self._unexpected("POST", "/v1/completions", response)
        try:
            choices = sorted(response.json()["choices"], key=lambda choice: choice["index"])
            rows = []
            for choice, sequence in zip(choices, sequences, strict=True):
                values = choice["logprobs"]["token_logprobs"][1 : len(sequence)]
                if len(values) != len(sequence) - 1:
                    raise ValueError(f"{len(values)} log-probabilities for {len(sequence)} tokens")
                rows.append([float(v) for v in values])
            return rows
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ProbeUnsupportedError(
                f"POST /v1/completions answered no prompt log-probabilities: {exc!r}"
            ) from exc

    async def _until_answered(
        self,
        method: str,
        path: str,
        *,
        seconds: float | None = None,
        json: Any = None,
        params: dict[str, str] | None = None,
        retry_server_errors: bool = True,
    ) -> httpx.Response:
        """Send until the server answers with a status below 500 and return that answer.

        Each request must be answered within ``seconds`` (default ``request_timeout``).
        Connection errors, timeouts and (with ``retry_server_errors``) 5xx answers are what a
        server that is reloading or restarting gives; they are retried with backoff, without
        end. The caller's cancel scope bounds it.
        """
        backoff = Backoff()
        async for _ in backoff:
            try:
                response = await self._send(
                    method, path, seconds=seconds or self.request_timeout, json=json, params=params
                )
            except httpx.TransportError as exc:
                problem = repr(exc)
            else:
                if response.status_code < 500 or not retry_server_errors:
                    return response
                problem = f"HTTP {response.status_code}: {response.text[:200]}"
            log.info("%s: %s %s: %s; retrying in %.1f s", self.name, method, path, problem,
                     backoff.delay)
        raise AssertionError("unreachable: Backoff never ends")

    def _unexpected(
        self, method: str, path: str, response: httpx.Response
    ) -> EngineUnhealthyError:
        status, text = response.status_code, response.text[:300]
        return EngineUnhealthyError(self.name, f"{method} {path} answered HTTP {status}: {text}")


def json_object(response: httpx.Response) -> dict[str, Any]:
    """The response body as a dict; an empty dict if it is not a JSON object."""
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}

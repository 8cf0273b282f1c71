"""SGLangEngine: the client of one sglang server (or of the embedded engine, which speaks the
same API subset).

Pin sequence: ``GET /health`` (or ``/health_generate``), ``POST /update_weights_from_disk`` with
the version label, then the version read back from the first endpoint this server has of
``/model_info``, ``/get_model_info``, ``/get_weight_version`` (probed once). In-flight requests
are never aborted: ``abort_all_requests`` is always false, and ``/update_weight_version`` (whose
default aborts every request) is never called.
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx

from actorsys.fleet.clients._http_engine import HttpEngine, json_object
from actorsys.fleet.fleet import CheckpointRejectedError, EngineUnhealthyError
from actorsys.fleet.pin.probe import PROBE_SAMPLING

VERSION_ENDPOINTS = ("/model_info", "/get_model_info", "/get_weight_version")


class SGLangEngine(HttpEngine):
    """One sglang server at ``url``.

    ``api_key`` is sent as a bearer token. ``health_generate=True`` makes the health check
    generate one token (``/health_generate``) instead of only asking ``/health``; a server
    without that endpoint falls back to ``/health``. ``flush_cache`` is passed to the load.
    Every method blocks on the server; none takes a timeout beyond the per-request ones: the
    caller's cancel scope bounds it, and cancelling closes the connection.
    """

    flavor = "sglang"
    """Which way it orders request priorities (:mod:`actorsys.fleet.clients.priority`)."""

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        api_key: str | None = None,
        health_generate: bool = False,
        flush_cache: bool = True,
        request_timeout: float = 30.0,
        load_timeout: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(
            url,
            name=name,
            api_key=api_key,
            request_timeout=request_timeout,
            load_timeout=load_timeout,
            transport=transport,
        )
        self.flush_cache = flush_cache
        self._health_path = "/health_generate" if health_generate else "/health"
        self._version_path: str | None = None

    async def health(self) -> None:
        """Return if the server answers its health check with 200; raise
        :class:`EngineUnhealthyError` if it refuses the connection or answers otherwise."""
        response = await self._probe(self._health_path)
        if response.status_code == 404 and self._health_path != "/health":
            self._health_path = "/health"
            response = await self._probe(self._health_path)
        if response.status_code != 200:
            raise self._unexpected("GET", self._health_path, response)

    async def load_weights(self, path: str, version: str) -> None:
        """Ask the server to load ``path`` as ``version``; return once it says it has.

        A 400 or ``success: false`` raises :class:`CheckpointRejectedError` (sglang keeps
        serving its previous weights then). Connection errors and 5xx while the server is
        busy are retried until the caller's deadline.
        """
        body = {
            "model_path": path,
            "weight_version": version,
            "flush_cache": self.flush_cache,
            "abort_all_requests": False,
        }
        route = "/update_weights_from_disk"
        response = await self._until_answered("POST", route, json=body, seconds=self.load_timeout)
        answer = json_object(response)
        if response.status_code == 200 and answer.get("success", True) is not False:
            return
        if response.status_code in (200, 400):
            message = str(answer.get("message") or response.text[:300])
            raise CheckpointRejectedError(self.name, path, message)
        raise self._unexpected("POST", route, response)

    async def weight_version(self) -> str | None:
        """The version label the server reports for the weights it serves.

        The first call finds which version endpoint the server has (a 404 means the server
        lacks that endpoint, not that it is unhealthy) and later calls use it. Raises
        :class:`EngineUnhealthyError` if the server has none of them.
        """
        paths = (self._version_path,) if self._version_path else VERSION_ENDPOINTS
        for path in paths:
            response = await self._until_answered("GET", path)
            if response.status_code == 404:
                continue
            if response.status_code != 200:
                raise self._unexpected("GET", path, response)
            answer = json_object(response)
            if "weight_version" not in answer:
                continue
            self._version_path = path
            version = answer["weight_version"]
            return None if version is None else str(version)
        if self._version_path is not None:
            self._version_path = None
            return await self.weight_version()
        raise EngineUnhealthyError(
            self.name,
            f"reports no weight version on any of {', '.join(VERSION_ENDPOINTS)}; "
            "serve with an sglang version that has /model_info or /get_weight_version",
        )

    async def prompt_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """The prefill probe: ``POST /v1/completions`` with ``echo``, ``logprobs`` and
        ``max_tokens`` 0 (one forward pass on the embedded engine). Raises
        :class:`~actorsys.fleet.pin.probe.ProbeUnsupportedError` where the server cannot answer
        it (the probe then asks :meth:`greedy_tokens`)."""
        return await self._prefill_probe(sequences, max_tokens=0)

    async def greedy_tokens(
        self, prompts: Sequence[Sequence[int]], max_tokens: int
    ) -> list[list[int]]:
        """The weight probe: ``POST /generate`` with the prompts as ``input_ids`` and greedy
        sampling; returns each answer's ``output_ids``. Raises
        :class:`~actorsys.fleet.pin.probe.ProbeUnsupportedError` if the server has no
        ``/generate`` or does not return token ids, :class:`EngineUnhealthyError` for
        another error status."""
        body = {
            "input_ids": [list(p) for p in prompts],
            "sampling_params": {**PROBE_SAMPLING, "max_new_tokens": max_tokens},
        }
        return await self._token_probe(
            "/generate", body, lambda answers: [answer["output_ids"] for answer in answers]
        )

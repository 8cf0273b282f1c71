"""VLLMEngine: the client of one vLLM OpenAI server started with ``VLLM_SERVER_DEV_MODE=1``.

Pin sequence: check the checkpoint here, then ``POST /pause?mode=wait`` (in-flight requests
finish on the old weights, none starts), ``POST /collective_rpc`` ``reload_weights``,
``POST /update_weight_version``, ``POST /resume``; the version is read from
``GET /weight_info``. Without the pause, answers in flight during a reload mix tokens of both
checkpoints.

vLLM does not refuse a checkpoint it cannot load: the reload fails inside the engine and the
server dies a moment later, while ``/health`` still answers 200. So the checkpoint is checked
before vLLM sees it (it exists, is complete where required, has the served architecture, and
its safetensors headers are whole and match the served model's tensors); the served model is
found through ``/v1/models`` unless ``served_model_dir`` is given.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import httpx
import trio

from actorsys._errors import ConfigError
from actorsys.fleet.checkpoint import (
    CheckpointMismatchError,
    TensorInfo,
    check_checkpoint,
    read_config,
    read_tensor_infos,
)
from actorsys.fleet.clients._http_engine import HttpEngine, json_object
from actorsys.fleet.fleet import CheckpointRejectedError, EngineUnhealthyError
from actorsys.fleet.pin.probe import PROBE_SAMPLING
from actorsys.runtime import ThreadTracker, run_blocking

T = TypeVar("T")

log = logging.getLogger("actorsys.fleet")

DEV_MODE_HINT = "start vLLM with VLLM_SERVER_DEV_MODE=1 to enable the weight-update endpoints"
RELOAD = "reload_weights"
TIED_RELOAD = "reload_weights_tied"
"""The reload of the worker extension in ``actorsys/fleet/vllm_worker``, which also rebuilds
a tied ``lm_head`` (vLLM's own reload leaves it stale on the CPU)."""


class VLLMEngine(HttpEngine):
    """One vLLM server at ``url``.

    ``served_model_dir``: the checkpoint the server was started from, as this process sees it
    (default: the ``root`` vLLM reports in ``/v1/models``); if it cannot be read here, only the
    checks that need no reference run. ``require_complete``: refuse checkpoints without the
    ``.complete`` marker. ``reload_method``: the worker method ``POST /collective_rpc`` calls
    to reload, ``"reload_weights"`` (vLLM's own) or ``"reload_weights_tied"`` on a server
    started with actorsys' worker extension (see ``actorsys.fleet.local.vllm``), which also
    reloads models with tied embeddings correctly. Every method blocks on the server; the
    caller's cancel scope bounds it, and cancelling closes the connection (a cancelled load
    still tries, shielded and within ``request_timeout``, to resume the server).
    """

    flavor = "vllm"
    """Which way it orders request priorities (:mod:`actorsys.fleet.clients.priority`)."""

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        api_key: str | None = None,
        served_model_dir: str | None = None,
        require_complete: bool = False,
        reload_method: str = RELOAD,
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
        self.served_model_dir = served_model_dir
        self.require_complete = require_complete
        if reload_method not in (RELOAD, TIED_RELOAD):
            raise ConfigError(
                "VLLMEngine(reload_method)",
                f"expected {RELOAD!r} or {TIED_RELOAD!r}, got {reload_method!r}",
            )
        self.reload_method = reload_method
        self._reference: tuple[dict[str, Any] | None, dict[str, TensorInfo] | None] | None = None
        self.threads = ThreadTracker()
        self._file_limiter = trio.CapacityLimiter(1)

    async def health(self) -> None:
        """Return if ``GET /health`` answers 200; raise :class:`EngineUnhealthyError` if the
        connection is refused or the answer is another status."""
        response = await self._probe("/health")
        if response.status_code != 200:
            raise self._unexpected("GET", "/health", response)

    async def load_weights(self, path: str, version: str) -> None:
        """Check ``path``, then pause, reload, label and resume the server.

        Raises :class:`CheckpointRejectedError` (before vLLM is asked anything) if the
        checkpoint cannot replace the served one, :class:`EngineUnhealthyError` if a step is
        refused. Connection errors and 5xx of the pause, label and resume steps are retried
        until the caller's deadline; a 5xx of the reload itself is not (it is a failed load).
        """
        await self._check(path)
        await self._post("/pause", params={"mode": "wait"})
        try:
            await self._post(
                "/collective_rpc",
                json={"method": self.reload_method, "kwargs": {"weights_path": path}},
                seconds=self.load_timeout,
                retry_server_errors=False,
            )
            await self._post("/update_weight_version", json={"new_version": version})
        except BaseException:
            with trio.CancelScope(shield=True), trio.move_on_after(self.request_timeout):
                try:
                    await self._post("/resume")
                except EngineUnhealthyError:
                    log.warning("%s: could not resume after a failed load", self.name)
            raise
        await self._post("/resume")

    async def weight_version(self) -> str | None:
        """The label of the served weights from ``GET /weight_info`` (``"default"`` until the
        first load)."""
        response = await self._until_answered("GET", "/weight_info")
        if response.status_code == 404:
            raise EngineUnhealthyError(self.name, f"has no /weight_info: {DEV_MODE_HINT}")
        if response.status_code != 200:
            raise self._unexpected("GET", "/weight_info", response)
        version = json_object(response).get("weight_version")
        return None if version is None else str(version)

    async def prompt_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """The prefill probe: ``POST /v1/completions`` with ``echo``, ``logprobs`` and
        ``max_tokens`` 1 (vLLM generates at least one token; its log-probability is left
        out). Raises :class:`~actorsys.fleet.pin.probe.ProbeUnsupportedError` where the server
        cannot answer it (the probe then asks :meth:`greedy_tokens`)."""
        return await self._prefill_probe(sequences, max_tokens=1)

    async def greedy_tokens(
        self, prompts: Sequence[Sequence[int]], max_tokens: int
    ) -> list[list[int]]:
        """The weight probe: one ``POST /v1/completions`` with the prompts as token ids,
        greedy, ``return_token_ids``; returns each choice's ``token_ids``. Raises
        :class:`~actorsys.fleet.pin.probe.ProbeUnsupportedError` if the server returns no token
        ids, :class:`EngineUnhealthyError` for an error status."""
        body = {
            "prompt": [list(p) for p in prompts],
            "max_tokens": max_tokens,
            "return_token_ids": True,
            **PROBE_SAMPLING,
            "top_k": 0,
        }
        return await self._token_probe(
            "/v1/completions",
            body,
            lambda answer: [
                choice["token_ids"]
                for choice in sorted(answer["choices"], key=lambda choice: choice["index"])
            ],
        )

    async def _post(
        self,
        path: str,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
        seconds: float | None = None,
        retry_server_errors: bool = True,
    ) -> None:
        response = await self._until_answered(
            "POST",
            path,
            json=json,
            params=params,
            seconds=seconds,
            retry_server_errors=retry_server_errors,
        )
        if response.status_code == 404:
            raise EngineUnhealthyError(self.name, f"has no POST {path}: {DEV_MODE_HINT}")
        if response.status_code != 200:
            raise self._unexpected("POST", path, response)

    async def _check(self, path: str) -> None:
        config, tensors = await self._served_reference()
        try:
            await self._read_files(
                lambda: check_checkpoint(
                    path,
                    require_complete=self.require_complete,
                    served_config=config,
                    served_tensors=tensors,
                ),
                f"check of {path}",
            )
        except CheckpointMismatchError as exc:
            raise CheckpointRejectedError(self.name, path, str(exc)) from exc

    async def _served_reference(
        self,
    ) -> tuple[dict[str, Any] | None, dict[str, TensorInfo] | None]:
        if self._reference is None:
            served = self.served_model_dir or await self._served_root()
            self._reference = await self._read_files(
                lambda: self._read_reference(served), f"read of {served}"
            )
        return self._reference

    async def _read_files(self, read: Callable[[], T], description: str) -> T:
        """Read checkpoint files (headers and configs) in a worker thread; only reads, so a
        cancelled caller abandons it. One read at a time: the caller holds the engine's file
        token while it waits, and gives it back when it returns or is cancelled; the thread
        itself runs on a limiter of its own, so a thread abandoned on a stuck file (a network
        filesystem that stopped answering) holds no token that a later check needs."""
        async with self._file_limiter:
            return await run_blocking(
                read,
                abandon_on_cancel=True,
                limiter=trio.CapacityLimiter(1),
                description=f"{self.name}: {description}",
                tracker=self.threads,
            )

    def _read_reference(
        self, served: str | None
    ) -> tuple[dict[str, Any] | None, dict[str, TensorInfo] | None]:
        if served is None or not os.path.isdir(served):
            log.warning(
                "%s: served model dir %r is not readable here; checkpoints are checked without "
                "comparing them to it",
                self.name,
                served,
            )
            return None, None
        try:
            return read_config(served), read_tensor_infos(served)
        except CheckpointMismatchError as exc:
            log.warning("%s: served model %s is unreadable here: %s", self.name, served, exc)
            return None, None

    async def _served_root(self) -> str | None:
        response = await self._until_answered("GET", "/v1/models")
        if response.status_code != 200:
            return None
        data = json_object(response).get("data")
        if isinstance(data, list) and data and isinstance(data[0], dict):
            root = data[0].get("root")
            return root if isinstance(root, str) else None
        return None

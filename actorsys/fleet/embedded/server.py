"""The embedded engine's HTTP server: the sglang API subset over a :class:`ModelHost`.

Endpoints: ``/health``, ``/health_generate``, ``/update_weights_from_disk``, ``/model_info``
(and ``/get_model_info``, ``/get_weight_version``, ``/v1/models``), ``/generate``,
``/v1/completions`` and ``/v1/chat/completions`` (:mod:`actorsys.fleet.embedded.chat`).
Requests that arrive together are generated in one batch, those of the lowest ``priority``
first (none is 0); a weight load
waits for the running batch, and no batch starts until the load is done (the engine pauses
the way vLLM's ``/pause?mode=wait`` does; :mod:`actorsys.fleet.embedded.batching`), so every
answer comes from one checkpoint and is stamped with its version
(``meta_info.weight_version`` / ``metadata.weight_version``).

With an ``api_key`` every route but ``/health`` answers only requests that carry
``Authorization: Bearer KEY`` (401 otherwise): anyone else who can connect could swap the
weights under the pinned label. A request that names a weight version in
``x-actorsys-weight-version`` (the request gate's) is answered only from those weights,
checked before and after it is generated (409 otherwise:
:mod:`actorsys.fleet.vllm_worker.actorsys_weight_version`). Bodies are read up to
``max_body_bytes`` (413 past it), then parsed, checked and tokenized in a worker thread, so
a large prompt never stalls the event loop (``/health`` keeps answering); a request that fails
its checks is a 400 naming the field.
Chat templates are rendered in a render worker process, killed past its deadline
(:mod:`actorsys.fleet.chat_template`), so no template can spin on a parse thread. Should the
parse threads still be stuck (every one busy, none freed for ``parse_stuck_after`` seconds),
``/health`` answers 503 until one frees: the engine is up but answers no request. Weight loads
parse and check on a limiter of their own, never on the parse threads.
A batch that fails as a whole is generated again request by request, so one request the checks
missed fails alone, never the requests batched with it.

Written on anyio: the engine process serves it on asyncio with hypercorn (whose trio worker
can crash the whole server when a connection closes while a response is being sent on it,
which sglang-router's HTTP/2 traffic triggers), and the tests drive it in process under trio.
Model work runs in a worker thread.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from actorsys.fleet.checkpoint import CheckpointMismatchError
from actorsys.fleet.embedded.batching import PRIORITY_GRACE, GenerationBatcher, _GenerationFailed
from actorsys.fleet.embedded.chat import ChatTemplates, chat_call, chat_response, openai_body
from actorsys.fleet.embedded.logprobs import openai_logprobs
from actorsys.fleet.embedded.model import (
    GenerationRequest,
    GenerationResult,
    ModelHost,
    stop_index,
)
from actorsys.fleet.embedded.requests import (
    _BadRequest,
    _BodyTooLarge,
    completion_requests,
    generate_requests,
    is_utf8,
    parse_body,
    request_priority,
)
from actorsys.fleet.vllm_worker.actorsys_api_key import ApiKeyMiddleware
from actorsys.fleet.vllm_worker.actorsys_weight_version import WeightVersionMiddleware

log = logging.getLogger("actorsys.engine")

MAX_BODY_BYTES = 4 * 1024 * 1024
PARSE_THREADS = 4
PARSE_STUCK_AFTER = 30.0
"""Seconds every parse thread may stay busy, none freed, before ``/health`` says 503 (well past
a chat template's render deadline and the tokenizing of the largest body)."""
T = TypeVar("T")


class EmbeddedEngine(GenerationBatcher):
    """The serving state of one engine: the batching of :class:`GenerationBatcher` (the model
    host, its lock, the batch queue) and the HTTP face over it.

    ``run`` must be running (in a nursery) for generation to make progress.
    """

    def __init__(
        self,
        host: ModelHost,
        *,
        max_batch: int = 16,
        priority_grace: float = PRIORITY_GRACE,
        require_complete: bool = False,
        served_model_name: str | None = None,
        api_key: str | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        parse_stuck_after: float = PARSE_STUCK_AFTER,
    ) -> None:
        super().__init__(host, max_batch=max_batch, priority_grace=priority_grace)
        self.require_complete = require_complete
        self.served_model_name = served_model_name or host.model_dir
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        # A few bodies are parsed at once, so that one huge prompt does not hold up the rest.
        # Encoding borrows the Rust tokenizer immutably (nothing here changes its truncation
        # or padding), so concurrent encodes are safe.
        self._parse_limiter = anyio.CapacityLimiter(PARSE_THREADS)
        self.parse_stuck_after = parse_stuck_after
        # When each busy parse thread took its body (monotonic seconds), by a key of its own.
        self._parsing: dict[object, float] = {}
        self._parsing_lock = threading.Lock()
        self._chat_templates = ChatTemplates(host)

    def app(self) -> Starlette:
        routes = [
            Route("/health", self._health, methods=["GET"]),
            Route("/health_generate", self._health_generate, methods=["GET"]),
            Route("/update_weights_from_disk", self._update_weights, methods=["POST"]),
            Route("/model_info", self._model_info, methods=["GET"]),
            Route("/get_model_info", self._model_info, methods=["GET"]),
            Route("/get_weight_version", self._weight_version, methods=["GET"]),
            Route("/server_info", self._server_info, methods=["GET"]),
            Route("/get_server_info", self._server_info, methods=["GET"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/generate", self._generate, methods=["POST"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/chat/completions", self._chat_completions, methods=["POST"]),
        ]
        # The key is checked first (the outermost), then the weight version a request names.
        middleware = [Middleware(ApiKeyMiddleware, key=self.api_key)] if self.api_key else []
        middleware.append(Middleware(WeightVersionMiddleware, served_version=self._served_version))
        return Starlette(
            routes=routes,
            middleware=middleware,
            exception_handlers={_GenerationFailed: _failed, _BadRequest: _refused},
        )

    async def _body(self, request: Request) -> bytes:
        """The request's body, read up to ``max_body_bytes``; :class:`_BodyTooLarge` past
        it (before reading it, if the client declared its length)."""
        limit = self.max_body_bytes
        too_large = _BodyTooLarge(f"the body is larger than the engine's limit of {limit} bytes")
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_large
        data = bytearray()
        try:
            async for chunk in request.stream():
                data += chunk
                if len(data) > limit:
                    raise too_large
        except ClientDisconnect:
            raise _BadRequest("the client closed the connection before the body ended") from None
        return bytes(data)

    async def _parsed(
        self,
        request: Request,
        build: Callable[[dict[str, Any]], T],
        limiter: anyio.CapacityLimiter | None = None,
    ) -> T:
        """``build`` applied to the request's JSON body, parsed and built in a worker thread
        (JSON decoding and tokenizing a large prompt take seconds), on ``limiter`` (default:
        the parse limiter)."""
        data = await self._body(request)
        if limiter is not None:
            return await anyio.to_thread.run_sync(lambda: build(parse_body(data)), limiter=limiter)
        return await anyio.to_thread.run_sync(
            lambda: self._parse_on_thread(lambda: build(parse_body(data))),
            limiter=self._parse_limiter,
        )

    async def _served_version(self, scope: object) -> str:
        """The version the engine serves, for :class:`WeightVersionMiddleware`."""
        return self.host.version

    def _parse_on_thread(self, parse: Callable[[], T]) -> T:
        """``parse()``, listed as busy while it runs (``/health`` reads the list)."""
        key = object()
        with self._parsing_lock:
            self._parsing[key] = time.monotonic()
        try:
            return parse()
        finally:
            with self._parsing_lock:
                del self._parsing[key]

    def parse_threads_stuck(self) -> bool:
        """Whether every parse thread is busy and none took its body in the last
        ``parse_stuck_after`` seconds: no request can be parsed, and none has been for that
        long."""
        with self._parsing_lock:
            started = list(self._parsing.values())
        if len(started) < PARSE_THREADS:
            return False
        return time.monotonic() - max(started) >= self.parse_stuck_after

    async def _health(self, request: Request) -> JSONResponse:
        if self.parse_threads_stuck():
            message = (f"every parse thread ({PARSE_THREADS}) has been busy for more than "
                       f"{self.parse_stuck_after:g} s")
            return JSONResponse({"status": "stuck", "message": message}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def _health_generate(self, request: Request) -> JSONResponse:
        ids = [self.host.pad_id]
        await self.generate([GenerationRequest(input_ids=ids, max_new_tokens=1)])
        return JSONResponse({"status": "ok"})

    async def _model_info(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "model_path": self.host.model_path,
                "tokenizer_path": self.host.model_dir,
                "is_generation": True,
                "weight_version": self.host.version,
            }
        )

    async def _server_info(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "model_path": self.host.model_dir,
                "tokenizer_path": self.host.model_dir,
                "served_model_name": self.served_model_name,
                "max_batch": self.max_batch,
                "weight_version": self.host.version,
                # Its queue orders as sglang's does with these arguments
                # (:mod:`actorsys.fleet.clients.priority` reads them).
                "enable_priority_scheduling": True,
                "schedule_low_priority_values_first": True,
                "default_priority_value": 0,
            }
        )

    async def _weight_version(self, request: Request) -> JSONResponse:
        return JSONResponse({"weight_version": self.host.version})

    async def _models(self, request: Request) -> JSONResponse:
        model = {
            "id": self.served_model_name,
            "object": "model",
            "root": self.host.model_dir,
            "owned_by": "actorsys",
            "max_model_len": self.host.max_positions,
        }
        return JSONResponse({"object": "list", "data": [model]})

    async def _update_weights(self, request: Request) -> JSONResponse:
        try:
            body = await self._parsed(request, lambda body: body, self.load_limiter)
            path = body.get("model_path")
            if not isinstance(path, str) or not path:
                raise _BadRequest("model_path: expected the checkpoint directory as a string")
            version = body.get("weight_version")
            if version is not None and not isinstance(version, str):
                raise _BadRequest("weight_version: expected a string or null")
            require = body.get("require_complete", self.require_complete)
            if not isinstance(require, bool):
                raise _BadRequest("require_complete: expected true or false")
            await self.load(path, version, require)
        except (_BadRequest, CheckpointMismatchError) as exc:
            log.warning("refused to load weights: %s", exc)
            status = exc.status if isinstance(exc, _BadRequest) else 400
            return JSONResponse({"success": False, "message": str(exc)}, status_code=status)
        log.info("loaded %s as version %s", path, self.host.version)
        message = "Succeeded to update model weights."
        return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})

    async def _generate(self, request: Request) -> JSONResponse:
        (requests, single), priority = await self._parsed(
            request, lambda body: (generate_requests(body, self.host), request_priority(body))
        )
        results = await self.generate(requests, priority=priority)
        answers = [
            {
                "text": self.host.decode(result.output_ids),
                "output_ids": result.output_ids,
                "meta_info": {
                    "id": uuid.uuid4().hex,
                    "prompt_tokens": len(req.input_ids),
                    "completion_tokens": len(result.output_ids),
                    "finish_reason": {"type": result.finish_reason},
                    "weight_version": result.weight_version,
                },
            }
            for req, result in zip(requests, results, strict=True)
        ]
        return JSONResponse(answers[0] if single else answers)

    async def _completions(self, request: Request) -> JSONResponse:
        model, requests, priority = await self._parsed(
            request,
            lambda body: (
                body.get("model"), completion_requests(body, self.host), request_priority(body)
            ),
        )
        results = await self.generate(requests, priority=priority)
        choices = [
            self._choice(index, req, result)
            for index, (req, result) in enumerate(zip(requests, results, strict=True))
        ]
        prompt_tokens = sum(len(r.input_ids) for r in requests)
        name = model if isinstance(model, str) and model and is_utf8(model) else None
        return JSONResponse(
            openai_body(
                "cmpl", "text_completion", name or self.served_model_name, choices,
                prompt_tokens, results,
            )
        )

    async def _chat_completions(self, request: Request) -> JSONResponse:
        call, priority = await self._parsed(
            request,
            lambda body: (chat_call(body, self.host, self._chat_templates), request_priority(body)),
        )
        results = await self.generate(call.requests, priority=priority)
        return JSONResponse(chat_response(call, results, self.host, self.served_model_name))

    def _choice(
        self, index: int, request: GenerationRequest, result: GenerationResult
    ) -> dict[str, Any]:
        """One ``choices`` entry: the text cut before the first stop sequence (as OpenAI does),
        after the prompt's text with ``echo``, and the log-probabilities asked for."""
        text = self.host.decode(result.output_ids)
        cut = stop_index(text, request.stop) if request.stop else None
        if cut is not None:
            text = text[:cut]
        prefix = self.host.decode(request.input_ids) if request.echo else ""
        logprobs = None
        if result.output_logprobs is not None:
            tokens = (result.prompt_logprobs or []) + result.output_logprobs
            logprobs = openai_logprobs(tokens, self.host.token_text)
        return {
            "index": index,
            "text": prefix + text,
            "finish_reason": result.finish_reason,
            "logprobs": logprobs,
        }


async def _failed(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"error": {"message": str(exc)}}, status_code=500)


async def _refused(request: Request, exc: Exception) -> JSONResponse:
    status = exc.status if isinstance(exc, _BadRequest) else 400
    return JSONResponse({"error": {"message": str(exc)}}, status_code=status)

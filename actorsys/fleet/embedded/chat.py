"""The embedded engine's ``/v1/chat/completions``: OpenAI chat requests rendered with the
served snapshot's chat template, and answers with Hermes tool calls read as vLLM reads them.

A chat client (the OpenAI SDK, inspect-ai, an agent framework) must get from the CPU engine
what it gets from vLLM serving the same snapshot, or an evaluation scores something else:

- the conversation (and ``tools``, ``chat_template_kwargs``) is rendered by
  :func:`~actorsys.fleet.chat_template.render_chat` with the tokenizer of the snapshot being
  served, and generated from the rendered **token ids** as they are (the template's BOS once);
- messages are first normalised as vLLM does (:mod:`actorsys.fleet.embedded.chat_messages`);
- with ``tools`` and ``tool_choice`` ``"auto"`` (the default), the answer is decoded with its
  special tokens (as vLLM's ``hermes`` parser asks) and its Hermes tool calls become
  ``tool_calls`` with ``finish_reason`` ``"tool_calls"``; ``parallel_tool_calls: false`` keeps
  the first. ``"required"`` and a named tool need guided decoding, which the engine has not:
  they are refused (400), as are streaming and chat log-probabilities;
- ``chat_template_kwargs`` may not carry ``apply_chat_template``'s own parameters (a
  ``chat_template`` there would replace the snapshot's template), and a template that fails in
  any way (a syntax error, a loop past its deadline, too deep, too big) is a 400 naming the
  problem: it is rendered in a render worker process that is killed past its deadline.

Everything a client sends is checked here (in a worker thread, with the body's parsing), so a
bad request is a 400 naming the field and never fails the batch it would have joined.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from actorsys.fleet.chat_template import (
    ChatTemplateMissingError,
    check_template_kwargs,
    has_chat_template,
    load_tokenizer,
    render_chat,
    warm_renderer,
)
from actorsys.fleet.embedded.chat_messages import chat_messages, chat_tools
from actorsys.fleet.embedded.hermes import parse_tool_calls
from actorsys.fleet.embedded.model import GenerationRequest, GenerationResult, stop_index
from actorsys.fleet.embedded.requests import (
    MAX_SEQUENCES,
    SEED_RANGE,
    _BadRequest,
    _request,
    _stop,
    default_max_tokens,
    is_utf8,
)

TOOL_CHOICES = ("auto", "none")
UNSUPPORTED_PENALTIES = ("frequency_penalty", "presence_penalty", "repetition_penalty")


class ChatHost(Protocol):
    """What chat requests need of the model host."""

    model_dir: str
    model_path: str
    tokenizer: Any
    max_positions: int
    vocab_size: int
    eos_ids: set[int]
    generation_max_tokens: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ChatTemplates:
    """The tokenizer whose template renders the conversations for the weights being served:
    the served snapshot's own (a template can change between checkpoints), loaded once per
    snapshot from its files; the engine's own where a snapshot holds none. Thread-safe."""

    def __init__(self, host: ChatHost) -> None:
        if has_chat_template(getattr(host, "tokenizer", None)):
            warm_renderer()  # the first chat request finds its render worker started
        self._host = host
        self._lock = threading.Lock()
        self._path: str | None = None
        self._tokenizer: Any = None

    def tokenizer(self) -> tuple[Any, str]:
        """The tokenizer and the snapshot it belongs to. Blocking (loads a new snapshot's)."""
        host = self._host
        path = host.model_path
        if path == host.model_dir:
            return host.tokenizer, path
        with self._lock:
            if self._path != path:
                try:
                    self._tokenizer = load_tokenizer(path)
                except (OSError, ValueError):
                    self._tokenizer = host.tokenizer
                self._path = path
            return self._tokenizer, path


@dataclass(frozen=True)
class ChatCall:
    """A parsed chat request: one generation request per choice, and how to answer it."""

    requests: list[GenerationRequest]
    model: str | None
    parse_tools: bool
    parallel_tool_calls: bool


def chat_call(body: dict[str, Any], host: ChatHost, templates: ChatTemplates) -> ChatCall:
    """The :class:`ChatCall` of a ``/v1/chat/completions`` body. Raises :class:`_BadRequest`
    naming the field. Blocking (renders the template, tokenizes)."""
    if body.get("stream"):
        raise _BadRequest("stream: streaming is not supported by the embedded engine")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise _BadRequest("logprobs: chat log-probabilities are not supported by the embedded engine")
    for name in UNSUPPORTED_PENALTIES:
        if body.get(name) not in (None, 0, 0.0):
            raise _BadRequest(f"{name}: not supported by the embedded engine (0 or null only)")
    if body.get("logit_bias"):
        raise _BadRequest("logit_bias: not supported by the embedded engine")
    messages = chat_messages(body.get("messages"))
    tools = chat_tools(body.get("tools"))
    tool_choice = body.get("tool_choice")
    if tool_choice is not None and tool_choice not in TOOL_CHOICES:
        raise _BadRequest(
            "tool_choice: only 'auto' and 'none' are supported by the embedded engine "
            "('required' and a named tool need guided decoding)"
        )
    parallel = body.get("parallel_tool_calls", True)
    if parallel is not None and not isinstance(parallel, bool):
        raise _BadRequest(f"parallel_tool_calls: expected true, false or null, got {parallel!r}")
    kwargs = body.get("chat_template_kwargs")
    problem = check_template_kwargs(kwargs)
    if problem is not None:
        raise _BadRequest(problem)
    add_generation_prompt = body.get("add_generation_prompt", True)
    if not isinstance(add_generation_prompt, bool):
        raise _BadRequest("add_generation_prompt: expected true or false")
    n = body.get("n", 1)
    if n is None:
        n = 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SEQUENCES:
        raise _BadRequest(f"n: expected an integer in [1, {MAX_SEQUENCES}], got {n!r}")
    tokenizer, path = templates.tokenizer()
    try:
        rendered = render_chat(
            tokenizer,
            messages,
            tools=tools,
            chat_template_kwargs=kwargs,
            add_generation_prompt=add_generation_prompt,
            path=path,
        )
    except (ChatTemplateMissingError, ValueError) as exc:
        raise _BadRequest(f"messages: {exc}") from None
    ids = list(rendered.token_ids)
    if len(ids) >= host.max_positions:
        raise _BadRequest(
            f"messages: the rendered prompt ({len(ids)} tokens) fills the model's "
            f"{host.max_positions} positions"
        )
    max_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(max_field)
    if max_tokens is None:
        max_tokens = default_max_tokens(host, len(ids))
    stop = _stop(body.get("stop"), "stop")
    seeds = _seeds(body.get("seed"), n)
    requests = [
        _request(
            ids,
            host,
            max_tokens=max_tokens,
            temperature=_default(body.get("temperature"), 1.0),
            top_p=_default(body.get("top_p"), 1.0),
            seed=seed,
            ignore_eos=body.get("ignore_eos", False),
            prefix="",
            max_tokens_field=max_field,
            stop=stop,
        )
        for seed in seeds
    ]
    model = body.get("model")
    return ChatCall(
        requests=requests,
        model=model if isinstance(model, str) and model and is_utf8(model) else None,
        parse_tools=bool(tools) and tool_choice != "none",
        parallel_tool_calls=parallel is not False,
    )


def chat_response(
    call: ChatCall, results: Sequence[GenerationResult], host: ChatHost, served_model_name: str
) -> dict[str, Any]:
    """The OpenAI ``chat.completion`` object answering ``call`` with ``results``; its
    ``metadata.weight_version`` is the version that generated them (as ``/v1/completions``
    reports it, so the request gate can hold chat answers to the pinned version too)."""
    choices = [
        _choice(index, call, request, result, host)
        for index, (request, result) in enumerate(zip(call.requests, results, strict=True))
    ]
    prompt_tokens = len(call.requests[0].input_ids) if call.requests else 0
    return openai_body(
        "chatcmpl", "chat.completion", call.model or served_model_name, choices, prompt_tokens,
        results,
    )


def openai_body(
    id_prefix: str,
    kind: str,
    model: str,
    choices: list[dict[str, Any]],
    prompt_tokens: int,
    results: Sequence[GenerationResult],
) -> dict[str, Any]:
    """The body of an OpenAI answer (``/v1/chat/completions`` or ``/v1/completions``):
    ``kind`` is its ``object``, ``usage`` counts ``prompt_tokens`` and the tokens of
    ``results``, and ``metadata.weight_version`` is the version that generated them."""
    completion_tokens = sum(len(r.output_ids) for r in results)
    return {
        "id": f"{id_prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "metadata": {"weight_version": results[0].weight_version if results else None},
    }


def _choice(
    index: int,
    call: ChatCall,
    request: GenerationRequest,
    result: GenerationResult,
    host: ChatHost,
) -> dict[str, Any]:
    ids = result.output_ids
    if ids and ids[-1] in host.eos_ids and not request.ignore_eos and result.finish_reason == "stop":
        ids = ids[:-1]
    if call.parse_tools:
        text = str(host.tokenizer.decode(ids, skip_special_tokens=False))
    else:
        text = host.decode(ids)
    cut = stop_index(text, request.stop) if request.stop else None
    if cut is not None:
        text = text[:cut]
    message: dict[str, Any] = {"role": "assistant", "content": text}
    finish_reason = result.finish_reason
    if call.parse_tools:
        parsed = parse_tool_calls(text)
        if parsed.tool_calls:
            calls = parsed.tool_calls if call.parallel_tool_calls else parsed.tool_calls[:1]
            message = {
                "role": "assistant",
                "content": parsed.content,
                "tool_calls": [c.as_openai() for c in calls],
            }
            finish_reason = "tool_calls"
    return {"index": index, "message": message, "logprobs": None, "finish_reason": finish_reason}


def _seeds(seed: Any, n: int) -> list[Any]:
    """One seed per choice: ``seed``, ``seed + 1``, ... (wrapped into torch's range), so the
    ``n`` choices of a seeded request differ and repeat. A bad seed is passed on unchanged,
    for the check that names it."""
    if seed is None or isinstance(seed, bool) or not isinstance(seed, int):
        return [seed] * n
    low, high = SEED_RANGE
    if not low <= seed < high:
        return [seed] * n
    return [(seed + i - low) % (high - low) + low for i in range(n)]


def _default(value: Any, default: float) -> Any:
    return default if value is None else value

"""Parsing the bodies of ``/generate`` (sglang) and ``/v1/completions`` (OpenAI) into
generation requests, with errors that name the bad field.

``/v1/completions`` takes what lm-evaluation-harness' ``local-completions`` model sends: prompts
as strings or token id lists, ``stop`` sequences, and for log-likelihoods ``echo`` with
``logprobs`` (and ``max_tokens`` 0 or 1).

Every value is checked here, per request, so that nothing a client sends can fail the batch it
is generated in: sampling values must be finite and in range (a temperature of 1e-300 would
turn the logits into infinities, a seed past 64 bits fails torch's generator), and a request
holds at most ``MAX_SEQUENCES`` prompts and ``MAX_STOP`` stop sequences."""

from __future__ import annotations

import json
import math
from typing import Any, Protocol

from actorsys.fleet.embedded.model import GenerationRequest

MAX_SEQUENCES = 256
MAX_LOGPROBS = 20
MAX_STOP = 32
MAX_STOP_CHARS = 1024
MIN_TEMPERATURE = 1e-5
MAX_TEMPERATURE = 1e3
SEED_RANGE = (-(2**63), 2**64)
"""torch's ``Generator.manual_seed`` takes exactly these."""
DEFAULT_MAX_TOKENS = 1024
"""The most tokens a chat request that names no ``max_tokens`` is given, where the model's
``generation_config.json`` names no ``max_new_tokens`` (:func:`default_max_tokens`)."""


class _BadRequest(ValueError):
    """A request body the engine cannot serve; the message names the field. ``status`` is the
    HTTP status it is answered with: a signal inside the engine, answered to the client, never
    raised out of it."""

    status = 400


class _BodyTooLarge(_BadRequest):
    """A request body over the engine's size limit (HTTP 413)."""

    status = 413


def parse_body(data: bytes) -> dict[str, Any]:
    """A request body as a JSON object; :class:`_BadRequest` for anything else (invalid JSON,
    invalid UTF-8, nesting too deep for the parser, another JSON type)."""
    try:
        body = json.loads(data)
    except RecursionError:
        raise _BadRequest("the body is nested too deeply to parse") from None
    except ValueError as exc:
        raise _BadRequest(f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise _BadRequest("the body must be a JSON object")
    return body


class Tokenizing(Protocol):
    max_positions: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...


class LengthDefaults(Protocol):
    max_positions: int
    generation_max_tokens: int | None


def default_max_tokens(host: LengthDefaults, prompt_tokens: int) -> int:
    """The ``max_tokens`` of a chat request that names none: what the context leaves after
    its ``prompt_tokens``, at most the model's ``generation_config.json`` ``max_new_tokens``
    (as vLLM bounds it) or else :data:`DEFAULT_MAX_TOKENS`. vLLM gives such a request all
    the context left; on the CPU engine that is minutes of a batch for every sequence of it
    (``n=256`` on a 32k context), so it is bounded here."""
    bound = host.generation_max_tokens or DEFAULT_MAX_TOKENS
    return max(0, min(host.max_positions - prompt_tokens, bound))


def generate_requests(
    body: dict[str, Any], host: Tokenizing
) -> tuple[list[GenerationRequest], bool]:
    """The requests of a ``/generate`` body, and whether it held a single prompt (answered
    with an object rather than a list)."""
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise _BadRequest("pass exactly one of text, input_ids")
    if text is not None:
        single = isinstance(text, str)
        prompts = [text] if single else _strings(text, "text")
        id_lists = [_encode(host, prompt, "text") for prompt in prompts]
    else:
        single = isinstance(input_ids, list) and all(_is_int(i) for i in input_ids)
        id_lists = _id_lists([input_ids] if single else input_ids, "input_ids")
    params = body.get("sampling_params") or {}
    param_list = params if isinstance(params, list) else [params] * len(id_lists)
    if len(param_list) != len(id_lists) or not all(isinstance(p, dict) for p in param_list):
        raise _BadRequest("sampling_params: expected an object, or a list of one object per prompt")
    requests = [
        _request(
            ids,
            host,
            max_tokens=p.get("max_new_tokens", 128),
            temperature=p.get("temperature", 1.0),
            top_p=p.get("top_p", 1.0),
            top_k=p.get("top_k"),
            seed=p.get("sampling_seed", p.get("seed")),
            ignore_eos=p.get("ignore_eos", False),
            prefix="sampling_params.",
            max_tokens_field="max_new_tokens",
            stop=_stop(p.get("stop"), "sampling_params.stop"),
        )
        for ids, p in zip(id_lists, param_list, strict=True)
    ]
    return requests, single


def completion_requests(body: dict[str, Any], host: Tokenizing) -> list[GenerationRequest]:
    """The requests of an OpenAI ``/v1/completions`` body (one per prompt; ``n`` must be 1)."""
    if body.get("stream"):
        raise _BadRequest("stream: streaming is not supported by the embedded engine")
    if body.get("n", 1) != 1:
        raise _BadRequest("n: only n=1 is supported")
    stop = _stop(body.get("stop"), "stop")
    logprobs = body.get("logprobs")
    if logprobs is not None and (
        isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= MAX_LOGPROBS
    ):
        raise _BadRequest(f"logprobs: expected an integer in [0, {MAX_LOGPROBS}] or null, got {logprobs!r}")
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise _BadRequest(f"echo: expected true or false, got {echo!r}")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        id_lists = [_encode(host, prompt, "prompt")]
    elif isinstance(prompt, list) and prompt and all(_is_int(p) for p in prompt):
        id_lists = [list(prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        id_lists = [_encode(host, p, "prompt") for p in _strings(prompt, "prompt")]
    elif isinstance(prompt, list) and prompt:
        id_lists = _id_lists(prompt, "prompt")
    else:
        raise _BadRequest("prompt: expected a string, a list of strings, or token ids")
    return [
        _request(
            ids,
            host,
            max_tokens=body.get("max_tokens", 16),
            temperature=body.get("temperature", 1.0),
            top_p=body.get("top_p", 1.0),
            top_k=body.get("top_k"),
            seed=body.get("seed"),
            ignore_eos=body.get("ignore_eos", False),
            prefix="",
            max_tokens_field="max_tokens",
            stop=stop,
            logprobs=logprobs,
            echo=echo,
        )
        for ids in id_lists
    ]


def _request(
    ids: list[int],
    host: Tokenizing,
    *,
    max_tokens: Any,
    temperature: Any,
    top_p: Any,
    seed: Any,
    ignore_eos: Any,
    top_k: Any = None,
    prefix: str,
    max_tokens_field: str,
    stop: tuple[str, ...] = (),
    logprobs: int | None = None,
    echo: bool = False,
) -> GenerationRequest:
    if not ids:
        raise _BadRequest("prompt: empty prompts are not supported")
    if not all(0 <= i < host.vocab_size for i in ids):
        raise _BadRequest(f"prompt: token ids must lie in [0, {host.vocab_size})")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise _BadRequest(
            f"{prefix}{max_tokens_field}: expected an integer >= 0, got {max_tokens!r}"
        )
    if len(ids) + max_tokens > host.max_positions:
        raise _BadRequest(
            f"{prefix}{max_tokens_field}: prompt ({len(ids)} tokens) + {max_tokens} exceeds the "
            f"model's {host.max_positions} positions"
        )
    if not _is_number(temperature) or not (
        temperature == 0 or MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE
    ):
        raise _BadRequest(
            f"{prefix}temperature: expected 0 (greedy) or a number in [{MIN_TEMPERATURE:g}, "
            f"{MAX_TEMPERATURE:g}], got {temperature!r}"
        )
    if not _is_number(top_p) or not 0 < top_p <= 1:
        raise _BadRequest(f"{prefix}top_p: expected a number in (0, 1], got {top_p!r}")
    if top_k is not None and (not _is_int(top_k) or top_k < -1):
        raise _BadRequest(f"{prefix}top_k: expected an integer >= -1 (-1 or 0: off), got {top_k!r}")
    low, high = SEED_RANGE
    if seed is not None and (not _is_int(seed) or not low <= seed < high):
        raise _BadRequest(
            f"{prefix}seed: expected an integer in [-2**63, 2**64) or null, got {seed!r}"
        )
    if not isinstance(ignore_eos, bool):
        raise _BadRequest(f"{prefix}ignore_eos: expected true or false, got {ignore_eos!r}")
    return GenerationRequest(
        input_ids=list(ids),
        max_new_tokens=max_tokens,
        temperature=float(temperature),
        top_p=float(top_p),
        top_k=top_k if top_k is not None and top_k > 0 else None,
        seed=seed,
        ignore_eos=ignore_eos,
        stop=stop,
        logprobs=logprobs,
        echo=echo,
    )


PRIORITY_RANGE = (-(2**63), 2**63)
"""The values vLLM's ``priority`` field takes (a signed 64-bit integer); sglang's alike."""


def request_priority(body: dict[str, Any]) -> int:
    """A body's ``priority`` (lower is batched first; none is 0), checked."""
    priority = body.get("priority")
    if priority is None:
        return 0
    low, high = PRIORITY_RANGE
    if not _is_int(priority) or not low <= priority < high:
        raise _BadRequest(f"priority: expected an integer in [-2**63, 2**63) or null, got {priority!r}")
    return int(priority)


def _stop(value: Any, field: str) -> tuple[str, ...]:
    """Stop sequences as a tuple of non-empty strings (OpenAI takes one string or a list)."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _BadRequest(f"{field}: expected a string, a list of strings, or null")
    if len(value) > MAX_STOP or any(len(v) > MAX_STOP_CHARS for v in value):
        raise _BadRequest(
            f"{field}: at most {MAX_STOP} stop sequences of at most {MAX_STOP_CHARS} characters"
        )
    return tuple(v for v in value if v)


def _strings(value: Any, field: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise _BadRequest(f"{field}: expected a string or a non-empty list of strings")
    if len(value) > MAX_SEQUENCES:
        raise _BadRequest(f"{field}: at most {MAX_SEQUENCES} prompts per request")
    return value


def _id_lists(value: Any, field: str) -> list[list[int]]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(ids, list) and all(_is_int(i) for i in ids) for ids in value)
    ):
        raise _BadRequest(f"{field}: expected a list of token ids, or a list of such lists")
    if len(value) > MAX_SEQUENCES:
        raise _BadRequest(f"{field}: at most {MAX_SEQUENCES} sequences per request")
    return value


def _encode(host: Tokenizing, text: str, field: str) -> list[int]:
    if not is_utf8(text):
        raise _BadRequest(f"{field}: the text is not valid Unicode (a lone surrogate escape)")
    return host.encode(text)


def is_utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (JSON's ``\\ud800`` escapes parse into strings
    that do not, and that tokenizers and JSON responses refuse)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """A finite int or float (JSON has no NaN, but Python's parser accepts ``NaN``)."""
    if isinstance(value, float):
        return math.isfinite(value)
    return _is_int(value)

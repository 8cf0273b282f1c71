"""Parsing the bodies of ``/generate`` (sglang) and ``/v1/completions`` (OpenAI) into
generation requests, with errors that name the bad field.

``/v1/completions`` takes what lm-evaluation-harness' ``local-completions`` model sends: prompts
as strings or token id lists, ``stop`` sequences, and for log-likelihoods ``echo`` with
``logprobs`` (and ``max_tokens`` 0 or 1)."""

from __future__ import annotations

from typing import Any, Protocol

from actorsys._errors import ActorsysError
from actorsys.fleet.embedded.model import GenerationRequest

MAX_SEQUENCES = 256
MAX_LOGPROBS = 20


class BadRequest(ActorsysError, ValueError):  # noqa: N818 - it is an HTTP 400, named as such
    """A request body the engine cannot serve; the message names the field."""


class Tokenizing(Protocol):
    max_positions: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...


def generate_requests(
    body: dict[str, Any], host: Tokenizing
) -> tuple[list[GenerationRequest], bool]:
    """The requests of a ``/generate`` body, and whether it held a single prompt (answered
    with an object rather than a list)."""
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise BadRequest("pass exactly one of text, input_ids")
    if text is not None:
        single = isinstance(text, str)
        prompts = [text] if single else _strings(text, "text")
        id_lists = [host.encode(prompt) for prompt in prompts]
    else:
        single = isinstance(input_ids, list) and all(isinstance(i, int) for i in input_ids)
        id_lists = _id_lists([input_ids] if single else input_ids)
    params = body.get("sampling_params") or {}
    param_list = params if isinstance(params, list) else [params] * len(id_lists)
    if len(param_list) != len(id_lists) or not all(isinstance(p, dict) for p in param_list):
        raise BadRequest("sampling_params: expected an object, or a list of one object per prompt")
    requests = [
        _request(
            ids,
            host,
            max_tokens=p.get("max_new_tokens", 128),
            temperature=p.get("temperature", 1.0),
            top_p=p.get("top_p", 1.0),
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
        raise BadRequest("stream: streaming is not supported by the embedded engine")
    if body.get("n", 1) != 1:
        raise BadRequest("n: only n=1 is supported")
    stop = _stop(body.get("stop"), "stop")
    logprobs = body.get("logprobs")
    if logprobs is not None and (
        isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= MAX_LOGPROBS
    ):
        raise BadRequest(f"logprobs: expected an integer in [0, {MAX_LOGPROBS}] or null, got {logprobs!r}")
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise BadRequest(f"echo: expected true or false, got {echo!r}")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        id_lists = [host.encode(prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        id_lists = [list(prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        id_lists = [host.encode(p) for p in prompt]
    elif isinstance(prompt, list) and prompt:
        id_lists = _id_lists(prompt)
    else:
        raise BadRequest("prompt: expected a string, a list of strings, or token ids")
    return [
        _request(
            ids,
            host,
            max_tokens=body.get("max_tokens", 16),
            temperature=body.get("temperature", 1.0),
            top_p=body.get("top_p", 1.0),
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
    prefix: str,
    max_tokens_field: str,
    stop: tuple[str, ...] = (),
    logprobs: int | None = None,
    echo: bool = False,
) -> GenerationRequest:
    if not ids:
        raise BadRequest("prompt: empty prompts are not supported")
    if not all(0 <= i < host.vocab_size for i in ids):
        raise BadRequest(f"prompt: token ids must lie in [0, {host.vocab_size})")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise BadRequest(
            f"{prefix}{max_tokens_field}: expected an integer >= 0, got {max_tokens!r}"
        )
    if len(ids) + max_tokens > host.max_positions:
        raise BadRequest(
            f"{prefix}{max_tokens_field}: prompt ({len(ids)} tokens) + {max_tokens} exceeds the "
            f"model's {host.max_positions} positions"
        )
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature < 0:
        raise BadRequest(f"{prefix}temperature: expected a number >= 0, got {temperature!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, int | float) or not 0 < top_p <= 1:
        raise BadRequest(f"{prefix}top_p: expected a number in (0, 1], got {top_p!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest(f"{prefix}seed: expected an integer or null, got {seed!r}")
    if not isinstance(ignore_eos, bool):
        raise BadRequest(f"{prefix}ignore_eos: expected true or false, got {ignore_eos!r}")
    return GenerationRequest(
        input_ids=list(ids),
        max_new_tokens=max_tokens,
        temperature=float(temperature),
        top_p=float(top_p),
        seed=seed,
        ignore_eos=ignore_eos,
        stop=stop,
        logprobs=logprobs,
        echo=echo,
    )


def _stop(value: Any, field: str) -> tuple[str, ...]:
    """Stop sequences as a tuple of non-empty strings (OpenAI takes one string or a list)."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"{field}: expected a string, a list of strings, or null")
    return tuple(v for v in value if v)


def _strings(value: Any, field: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"{field}: expected a string or a non-empty list of strings")
    if len(value) > MAX_SEQUENCES:
        raise BadRequest(f"{field}: at most {MAX_SEQUENCES} prompts per request")
    return value


def _id_lists(value: Any) -> list[list[int]]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(ids, list) and all(isinstance(i, int) for i in ids) for ids in value)
    ):
        raise BadRequest("input_ids: expected a list of token ids, or a list of such lists")
    if len(value) > MAX_SEQUENCES:
        raise BadRequest(f"input_ids: at most {MAX_SEQUENCES} sequences per request")
    return value

"""Chat prompts rendered with a snapshot's own chat template: the one renderer that datasets
(``apply_chat_template``) and the CPU engine's ``/v1/chat/completions`` share.

A chat model is trained on the text its template makes of a conversation, and scored on any
other text it is scored wrongly. So a conversation is rendered by the tokenizer of the snapshot
being served (a template can change between checkpoints), with the record's tools, the
template's keyword arguments (``enable_thinking``) and the generation prompt, and it reaches
the engine as **token ids**, never as text:

- a template that begins with the BOS puts it in the text, and an engine that tokenizes that
  text adds its own BOS in front (Llama-3's and most tokenizers do for plain text): two BOS, a
  prompt the model never saw. Token ids are taken as they are by the CPU engine, vLLM and
  sglang alike, so the template's BOS is there exactly once, and nothing is added;
- the ids are the tokenizer's encoding of the rendered text with ``add_special_tokens=False``,
  which is what ``apply_chat_template(..., tokenize=True)`` itself returns.

A template is untrusted code, so it is rendered to text in a render worker process
(:mod:`actorsys.fleet._render.pool`: transformers' own renderer, so the text is exactly
``apply_chat_template``'s), within a deadline, a memory cap and a cap on the text's length;
this process only tokenizes the text. A template that loops for ever, builds a huge string,
recurses or fails in any other way is a ``ValueError`` naming the problem, never a thread that
spins for good. The template's keyword arguments may not carry ``apply_chat_template``'s own
parameters (:data:`TEMPLATE_ARGUMENTS`): a ``chat_template`` there would replace the template.

Rendering is blocking (a worker process, a tokenizer): run it in a worker thread.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from actorsys._errors import ChatTemplateMissingError
from actorsys.fleet._render.pool import (
    RENDER_TIMEOUT,
    RenderJob,
    _RenderOverrun,
    render_workers,
)
from actorsys.fleet.checkpoint import check_tokenizer_files

TEMPLATE_ARGUMENTS = frozenset({
    "conversation", "conversations", "messages", "tools", "documents", "chat_template",
    "add_generation_prompt", "continue_final_message", "tokenize", "sanitize_control_tokens",
    "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs",
})
"""``apply_chat_template``'s own parameters and the variables its renderer sets, none of which
a template's keyword arguments may carry: ``chat_template`` would replace the snapshot's
template outright, ``tokenize`` or ``return_dict`` change what comes back, ``messages`` or
``tools`` what is rendered."""

Messages = Sequence[Mapping[str, Any]]
"""A conversation: OpenAI-style message dicts (``role``, ``content``, and what the template
understands, such as ``tool_calls`` or ``reasoning_content``)."""


@dataclass(frozen=True)
class RenderedPrompt:
    """A conversation as its template renders it: the ``text`` (what samples keep as their
    prompt) and the ``token_ids`` the engine is sent (the template's special tokens once,
    nothing added)."""

    text: str
    token_ids: tuple[int, ...]


def load_tokenizer(model_dir: str) -> Any:
    """The tokenizer saved with the snapshot at ``model_dir``, from its files only (never a
    hub), none of them a link leading outside it. Blocking. Raises ``OSError``/``ValueError``
    where none loads (:class:`~actorsys.CheckpointMismatchError`, a ``ValueError``, naming a
    file that links outside: :func:`~actorsys.fleet.checkpoint.check_tokenizer_files`)."""
    from transformers import AutoTokenizer

    check_tokenizer_files(model_dir)
    return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def warm_renderer() -> None:
    """Start a render worker in the background, so the first render finds it ready. Returns
    at once."""
    render_workers().warm()


def overran(error: BaseException) -> bool:
    """Whether ``error`` (raised by :func:`render_chat`) says the render ran past its
    deadline (a template that loops), rather than that the template refused the
    conversation."""
    return isinstance(error, _RenderOverrun)


def render_chat(
    tokenizer: Any,
    messages: Messages,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    add_generation_prompt: bool = True,
    path: str = "the snapshot",
    timeout: float = RENDER_TIMEOUT,
) -> RenderedPrompt:
    """``messages`` rendered with ``tokenizer``'s chat template (``path`` names its snapshot in
    errors), in a render worker within ``timeout`` seconds. Raises
    :class:`ChatTemplateMissingError` where the tokenizer has none, and ``ValueError`` naming
    the problem where ``chat_template_kwargs`` carries one of :data:`TEMPLATE_ARGUMENTS` or
    the template fails: it refuses the conversation (a Jinja ``raise_exception``, a role it
    does not know), does not parse, recurses, needs too much memory, renders too much text or
    runs past ``timeout`` (:func:`overran`; its worker is killed). Blocking: on the worker,
    then on the tokenizer; bounded by ``timeout`` (plus a worker's start, where none is
    idle)."""
    if not has_chat_template(tokenizer):
        raise ChatTemplateMissingError(path)
    problem = check_template_kwargs(chat_template_kwargs)
    if problem is not None:
        raise ValueError(problem)
    try:
        template = tokenizer.get_chat_template(None, [dict(t) for t in tools] if tools else None)
    except ValueError as exc:  # several templates and no default among them
        raise ValueError(f"the chat template of {path} cannot be chosen: {exc}") from None
    if not isinstance(template, str):
        raise ValueError(f"the chat template of {path} is {type(template).__name__}, not text")
    job = RenderJob(
        template=template,
        messages=messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        # As apply_chat_template merges them: the caller's arguments over the special tokens.
        variables={**tokenizer.special_tokens_map, **(chat_template_kwargs or {})},
    )
    try:
        text = render_workers().render(job, timeout=timeout)
    except _RenderOverrun as exc:
        raise _RenderOverrun(f"the chat template of {path} cannot render this conversation: "
                             f"{exc}") from None
    except ValueError as exc:
        raise ValueError(f"the chat template of {path} cannot render this conversation: "
                         f"{exc}") from None
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return RenderedPrompt(text, tuple(int(i) for i in ids))


def check_template_kwargs(value: object) -> str | None:
    """Why ``value`` cannot be a template's keyword arguments (None when it can): an object
    whose keys are names, none of them one of :data:`TEMPLATE_ARGUMENTS`. The problem starts
    with the key at fault (``chat_template_kwargs.chat_template: ...``)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        return "chat_template_kwargs: expected an object of the template's keyword arguments"
    for key in value:
        if key in TEMPLATE_ARGUMENTS:
            return (f"chat_template_kwargs.{key}: {key!r} is an argument of apply_chat_template "
                    "itself, not of the template, and cannot be set here")
    return None


def check_messages(value: object) -> str | None:
    """Why ``value`` is not a conversation the renderer takes (None when it is): a non-empty
    list of objects, each with a string ``role`` and a ``content`` that is a string, a list of
    parts, or null (an assistant turn that only calls tools)."""
    if not isinstance(value, list) or not value:
        return "expected a non-empty list of chat messages"
    for index, message in enumerate(value):
        if not isinstance(message, Mapping):
            return f"message {index}: expected an object with 'role' and 'content'"
        role = message.get("role")
        if not isinstance(role, str) or not role:
            return f"message {index}: 'role' must be a non-empty string, got {_excerpt(role)}"
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            return f"message {index}: 'content' must be a string, a list of parts or null"
    return None


def check_tools(value: object) -> str | None:
    """Why ``value`` is not a list of tool schemas (objects) the template can take."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, Mapping) for t in value):
        return "expected a list of tool schemas (JSON objects)"
    return None


def _excerpt(value: object, limit: int = 60) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= limit else text[:limit] + "..."

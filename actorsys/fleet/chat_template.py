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

Rendering is blocking (a Jinja template, a tokenizer): run it in a worker thread.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from actorsys._errors import ChatTemplateMissingError
from actorsys.fleet.checkpoint import check_tokenizer_files

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


def render_chat(
    tokenizer: Any,
    messages: Messages,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    add_generation_prompt: bool = True,
    path: str = "the snapshot",
) -> RenderedPrompt:
    """``messages`` rendered with ``tokenizer``'s chat template (``path`` names its snapshot in
    errors). Raises :class:`ChatTemplateMissingError` where the tokenizer has none, and
    ``ValueError`` where the template refuses the conversation (a Jinja
    ``raise_exception``, a role it does not know). Blocking."""
    if not has_chat_template(tokenizer):
        raise ChatTemplateMissingError(path)
    kwargs = dict(chat_template_kwargs or {})
    try:
        text = tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=[dict(t) for t in tools] if tools else None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **kwargs,
        )
    except (TypeError, KeyError, IndexError) as exc:
        raise ValueError(f"the chat template of {path} cannot render this conversation: "
                         f"{type(exc).__name__}: {exc}") from None
    except Exception as exc:  # jinja2's TemplateError (raise_exception) and its kin
        if type(exc).__module__.startswith("jinja2"):
            raise ValueError(f"the chat template of {path} refused this conversation: {exc}") from None
        raise
    if not isinstance(text, str):
        raise ValueError(f"the chat template of {path} rendered {type(text).__name__}, not text")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return RenderedPrompt(text, tuple(int(i) for i in ids))


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

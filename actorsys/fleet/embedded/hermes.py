"""Tool calls written in the Hermes form, read out of a model's text as vLLM's ``hermes`` tool
parser reads them (non-streaming), so that an agent evaluated on the CPU engine sees the same
``tool_calls`` it would see from vLLM serving the same model with ``--tool-call-parser hermes``.

A call is ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` (Qwen2.5/3, Hermes 2 Pro,
and most chat models trained on tools write it so); the closing tag may be missing at the end of
the text (generation stopped before it). As in vLLM, it is all or nothing: when any call fails
to parse (invalid JSON, no ``name`` or ``arguments``) the whole text stays the message's
content and no call is returned, so a malformed call is never half-executed. Otherwise the
content is the text before the first ``<tool_call>`` (None when empty), and each call's
``arguments`` is re-serialised as a JSON string (OpenAI's wire form).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One call: ``arguments`` is a JSON string; ``id`` is fresh for every call."""

    name: str
    arguments: str
    id: str

    def as_openai(self) -> dict[str, object]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ParsedMessage:
    """What an assistant's text says: its ``content`` and the ``tool_calls`` it makes."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()


def parse_tool_calls(text: str) -> ParsedMessage:
    """``text`` split into content and Hermes tool calls, exactly as vLLM's ``hermes`` parser
    splits a whole (non-streamed) answer; see the module's docstring. Pure."""
    if TOOL_CALL_START not in text:
        return ParsedMessage(text)
    calls = []
    for closed, open_ended in _TOOL_CALL.findall(text):
        try:
            call = json.loads(closed if closed else open_ended)
            calls.append(
                ToolCall(
                    name=_name(call["name"]),
                    arguments=json.dumps(call["arguments"], ensure_ascii=False),
                    id=new_tool_call_id(),
                )
            )
        except (ValueError, TypeError, KeyError, RecursionError):
            return ParsedMessage(text)
    content = text[: text.find(TOOL_CALL_START)]
    return ParsedMessage(content or None, tuple(calls))


def new_tool_call_id() -> str:
    """A fresh call id in vLLM's form (``chatcmpl-tool-`` and 32 hex digits)."""
    return f"chatcmpl-tool-{secrets.token_hex(16)}"


def _name(value: object) -> str:
    """vLLM's ``FunctionCall(name=...)`` is a pydantic string field: anything else fails the
    parse (and so leaves the text as content)."""
    if not isinstance(value, str):
        raise TypeError(f"a tool call's name must be a string, got {type(value).__name__}")
    return value

"""The messages and tools of an OpenAI chat request, checked (a 400 naming the field) and
normalised as vLLM normalises them before the chat template sees them:

- a content given as parts is the text of its text parts joined by newlines (other parts are
  refused: the engine serves text models);
- an assistant's ``tool_calls`` carry their ``arguments`` as the object templates expect, not
  the JSON string of OpenAI's wire form (a malformed or non-object one becomes ``{}``, so one
  bad turn in a conversation's history does not break every later turn); an empty
  ``tool_calls`` list is dropped;
- tools are ``{"type": "function", "function": {"name": ..., ...}}`` objects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from actorsys.fleet.chat_template import check_messages, check_tools
from actorsys.fleet.embedded.requests import _BadRequest, is_utf8


def chat_messages(value: Any) -> list[dict[str, Any]]:
    """The conversation, checked and normalised as vLLM normalises it (see the module)."""
    problem = check_messages(value)
    if problem is not None:
        raise _BadRequest(f"messages: {problem}")
    messages = []
    for index, message in enumerate(value):
        message = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            message["content"] = _text_parts(content, index)
        elif isinstance(content, str) and not is_utf8(content):
            raise _BadRequest(f"messages[{index}].content: the text is not valid Unicode")
        if message["role"] == "assistant" and "tool_calls" in message:
            _assistant_tool_calls(message, index)
        messages.append(message)
    return messages


def _text_parts(parts: list[Any], index: int) -> str:
    texts = []
    for part in parts:
        if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(
            part.get("text"), str
        ):
            raise _BadRequest(
                f"messages[{index}].content: only text parts ({{'type': 'text', 'text': ...}}) "
                "are supported by the embedded engine"
            )
        if not is_utf8(part["text"]):
            raise _BadRequest(f"messages[{index}].content: the text is not valid Unicode")
        texts.append(part["text"])
    return "\n".join(texts)


def _assistant_tool_calls(message: dict[str, Any], index: int) -> None:
    calls = message.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise _BadRequest(f"messages[{index}].tool_calls: expected a list of tool calls")
    if not calls:
        message.pop("tool_calls")
        return
    normalised = []
    for position, item in enumerate(calls):
        field = f"messages[{index}].tool_calls[{position}]"
        if not isinstance(item, Mapping):
            raise _BadRequest(f"{field}: expected an object")
        function = item.get("function")
        if item.get("type", "function") != "function" or not isinstance(function, Mapping):
            raise _BadRequest(f"{field}: only tool calls of type 'function' are supported")
        function = dict(function)
        function["arguments"] = _arguments(function.get("arguments"))
        normalised.append({**item, "function": function})
    message["tool_calls"] = normalised


def _arguments(value: Any) -> Any:
    if not value:
        return {}
    if isinstance(value, dict):
        return value
    parsed = value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            parsed = None
    return parsed if isinstance(parsed, dict) else {}


def chat_tools(value: Any) -> list[dict[str, Any]] | None:
    """The tool schemas (None for none), checked."""
    problem = check_tools(value)
    if problem is not None:
        raise _BadRequest(f"tools: {problem}")
    if not value:
        return None
    for index, tool in enumerate(value):
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, Mapping):
            raise _BadRequest(f"tools[{index}]: expected {{'type': 'function', 'function': {{...}}}}")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise _BadRequest(f"tools[{index}].function.name: expected a non-empty string")
    return [dict(tool) for tool in value]

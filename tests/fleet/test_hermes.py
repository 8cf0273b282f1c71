"""Hermes tool calls read as vLLM's ``hermes`` parser reads a whole answer."""

from __future__ import annotations

import json

import pytest

from actorsys.fleet.embedded.hermes import parse_tool_calls

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": "é"}}\n</tool_call>'


def test_text_without_a_tool_call_is_all_content() -> None:
    parsed = parse_tool_calls("the answer is 4")
    assert parsed.content == "the answer is 4" and parsed.tool_calls == ()


def test_calls_become_json_string_arguments_and_the_text_before_them_content() -> None:
    parsed = parse_tool_calls(f"thinking...\n{CALL}\n{CALL}")
    assert parsed.content == "thinking...\n"
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("add", {"a": 1, "b": "é"})] * 2
    assert parsed.tool_calls[0].arguments == '{"a": 1, "b": "é"}'
    assert len({c.id for c in parsed.tool_calls}) == 2


def test_a_call_cut_before_its_closing_tag_still_counts_and_empty_content_is_none() -> None:
    parsed = parse_tool_calls('<tool_call>{"name": "f", "arguments": [1]}')
    assert parsed.content is None
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("f", "[1]")]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "f", "arguments": {</tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "f"}</tool_call>',
        '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
        '<tool_call>["f"]</tool_call>',
        "<tool_call></tool_call>",
        f'{CALL}<tool_call>{{"name": "g", "arguments": nope}}</tool_call>',
    ],
)
def test_any_malformed_call_leaves_the_whole_text_as_content(text: str) -> None:
    parsed = parse_tool_calls(text)
    assert parsed.content == text and parsed.tool_calls == ()

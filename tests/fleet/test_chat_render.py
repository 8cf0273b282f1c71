"""Chat templates rendered in the render worker: the text and token ids transformers'
``apply_chat_template`` makes, on the repository's real tokenizers and templates; a template
that loops, recurses, builds a huge string or fails otherwise is a ``ValueError`` naming the
problem, within its deadline; keyword arguments may not carry ``apply_chat_template``'s own."""

from __future__ import annotations

import inspect
import time
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import render_jinja_template

from actorsys.fleet.chat_template import (
    TEMPLATE_ARGUMENTS,
    overran,
    render_chat,
)
from tests.chat_models import (
    ADD_TOOL,
    CHAT_TEMPLATE,
    CONVERSATIONS,
    HOSTILE_TEMPLATE,
    TOOL_CHAT_TEMPLATE,
    make_chat_tokenizer,
    make_tool_chat_tokenizer,
)

ASSISTANT_CALL_WITHOUT_CONTENT: dict[str, Any] = {"messages": [
    {"role": "user", "content": "add 1 and 2"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
    {"role": "tool", "content": "3"},
], "tools": [ADD_TOOL]}


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, PreTrainedTokenizerFast]:
    both = make_chat_tokenizer()
    both.chat_template = {"default": CHAT_TEMPLATE, "tool_use": TOOL_CHAT_TEMPLATE}
    hostile = make_tool_chat_tokenizer()
    hostile.chat_template = HOSTILE_TEMPLATE
    return {"qwen3": make_chat_tokenizer(), "tools": make_tool_chat_tokenizer(),
            "named": both, "hostile": hostile}


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}])
@pytest.mark.parametrize("name", ["qwen3", "tools", "named"])
def test_the_text_and_ids_are_apply_chat_templates(
    tokenizers: dict[str, PreTrainedTokenizerFast], name: str, kwargs: dict[str, Any]
) -> None:
    tokenizer = tokenizers[name]
    for conversation in [*CONVERSATIONS, ASSISTANT_CALL_WITHOUT_CONTENT]:
        messages = conversation["messages"]
        messages = user(messages) if isinstance(messages, str) else messages
        tools = conversation.get("tools")
        rendered = render_chat(tokenizer, messages, tools=tools, chat_template_kwargs=kwargs)
        text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                             tokenize=False, **kwargs)
        ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                            tokenize=True, **kwargs)["input_ids"]
        assert rendered.text == text
        assert list(rendered.token_ids) == list(ids)
        assert rendered.token_ids[0] == tokenizer.bos_token_id != rendered.token_ids[1]


def test_template_arguments_hold_every_parameter_of_apply_chat_template() -> None:
    parameters = set(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters)
    renderer = set(inspect.signature(render_jinja_template).parameters)
    assert (parameters | renderer) - {"self", "kwargs"} <= TEMPLATE_ARGUMENTS
    assert "messages" in TEMPLATE_ARGUMENTS  # the variable the renderer sets


@pytest.mark.parametrize("key", ["chat_template", "tokenize", "return_dict", "tools",
                                 "add_generation_prompt", "continue_final_message", "messages"])
def test_template_kwargs_carrying_an_argument_of_apply_chat_template_are_refused(
    tokenizers: dict[str, PreTrainedTokenizerFast], key: str
) -> None:
    with pytest.raises(ValueError, match=rf"^chat_template_kwargs\.{key}: ") as refused:
        render_chat(tokenizers["tools"], user("hi"),
                    chat_template_kwargs={key: "{{ 'not the snapshot template' }}"})
    assert "apply_chat_template" in str(refused.value)


@pytest.mark.timeout(120)
def test_a_looping_template_is_stopped_at_its_deadline_and_the_next_render_works(
    tokenizers: dict[str, PreTrainedTokenizerFast],
) -> None:
    render_chat(tokenizers["tools"], user("hi"))  # a worker is ready
    started = time.monotonic()
    with pytest.raises(ValueError, match="deadline of 2 s") as stopped:
        render_chat(tokenizers["hostile"], user("loop"), timeout=2.0, path="/snap")
    assert time.monotonic() - started < 2.0 + 10.0
    assert overran(stopped.value)
    assert "/snap" in str(stopped.value)
    after = render_chat(tokenizers["hostile"], user("hi"))
    assert after.text == tokenizers["tools"].apply_chat_template(
        user("hi"), add_generation_prompt=True, tokenize=False)


@pytest.mark.parametrize(("content", "problem"), [
    ("huge", "more memory than a render may take"),
    ("long", "rendered text is too long: it rendered 5000000 characters"),
    ("recursion", "recursed or nested too deeply"),
    ("range", "OverflowError: Range too big"),
])
def test_a_failing_template_is_a_value_error_naming_the_problem(
    tokenizers: dict[str, PreTrainedTokenizerFast], content: str, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem) as failed:
        render_chat(tokenizers["hostile"], user(content))
    assert not overran(failed.value)


def test_a_template_that_does_not_parse_or_refuses_is_a_value_error_naming_it() -> None:
    tokenizer = make_tool_chat_tokenizer()
    tokenizer.chat_template = "{% if %}"
    with pytest.raises(ValueError, match="TemplateSyntaxError"):
        render_chat(tokenizer, user("hi"))
    tokenizer.chat_template = "{{ raise_exception('only user turns') }}"
    with pytest.raises(ValueError, match="TemplateError: only user turns"):
        render_chat(tokenizer, user("hi"))


def test_deeply_nested_tools_or_arguments_are_a_value_error(
    tokenizers: dict[str, PreTrainedTokenizerFast],
) -> None:
    for depth in (800, 5000):
        nested: dict[str, Any] = {}
        inner = nested
        for _ in range(depth):
            inner["a"] = {}
            inner = inner["a"]
        tool = {"type": "function", "function": {"name": "f", "parameters": nested}}
        with pytest.raises(ValueError, match="nest|recursed"):
            render_chat(tokenizers["tools"], user("hi"), tools=[tool])

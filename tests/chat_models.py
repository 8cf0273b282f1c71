"""Two tiny chat models made here (nothing from a hub), Llamas with random weights whose
byte-level BPE tokenizers add a BOS to plain text (as Llama-3's does) under a chat template that
itself begins with the BOS: such a model is where a second BOS shows, its template's text
tokenized as plain text starting ``<|bos|><|bos|>``.

- :func:`make_chat_model`: a tokenizer over printable ASCII and a Qwen3-style template with
  tools, system messages, multi-turn histories, tool calls and an ``enable_thinking`` switch.
  ``<think>`` and ``</think>`` are plain text (several BPE tokens), so every engine decodes
  them into its answers as transformers does.
- :func:`make_tool_chat_model`: for the OpenAI-API tests and benchmarks, a tokenizer with every
  byte in its alphabet (any text encodes) and Qwen2.5's template with its tool prompt
  (``<tool_call>`` blocks, which vLLM's hermes parser reads).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, LlamaConfig, PreTrainedTokenizerFast

from actorsys.fleet.model_load import load_causal_lm
from tests.models import random_model, tiny_config

BOS, EOS, PAD = "<|bos|>", "<|im_end|>", "<|endoftext|>"
IM_START, IM_END = "<|im_start|>", EOS
SPECIAL = [BOS, PAD, IM_START, EOS]
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- if tools -%}"
    "<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif -%}"
    "# Tools\n<tools>\n"
    "{%- for tool in tools %}{{ tool | tojson }}\n{% endfor -%}"
    "</tools><|im_end|>\n"
    "{%- elif messages[0].role == 'system' -%}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}"
    "{%- elif message.role == 'assistant' -%}"
    "<|im_start|>assistant\n{{ message.content or '' }}"
    "{%- for call in message.tool_calls or [] %}<tool_call>{{ call.function | tojson }}</tool_call>"
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' -%}"
    "<|im_start|>user\n<tool_response>{{ message.content }}</tool_response><|im_end|>\n"
    "{%- else -%}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif -%}"
    "{%- endif -%}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "what is two plus two? the answer is four, so \\boxed{4}",
    "<think>\nlet me think step by step\n</think>\n\nAnswer: 12",
    '{"type": "function", "function": {"name": "add", "parameters": {}}}',
    "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1}}</tool_call>",
    "system user assistant tools tool_response You are a helpful assistant.",
]
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "add two numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                        "b": {"type": "number"}}},
    },
}
CONVERSATIONS: list[dict[str, Any]] = [
    {"messages": "what is two plus two?"},
    {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "the quick brown fox"}]},
    {"messages": [{"role": "user", "content": "add 1 and 2"}], "tools": [ADD_TOOL]},
    {"messages": [
        {"role": "user", "content": "add 1 and 2"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function",
                         "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
        {"role": "tool", "content": "3"},
        {"role": "user", "content": "and now think"},
    ], "tools": [ADD_TOOL]},
    {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
                  {"role": "user", "content": "the lazy dog"}]},
]
"""The conversations every engine must answer exactly as transformers does: a string prompt,
a system message, tools, a multi-turn history with a tool call and its result."""


def _ascii_alphabet() -> list[str]:
    """Printable ASCII, newline and tab as the byte-level pre-tokenizer spells them."""
    table = pre_tokenizers.ByteLevel.alphabet()
    mapping = _bytes_to_unicode()
    wanted = [mapping[b] for b in [9, 10, *range(32, 127)]]
    return [ch for ch in wanted if ch in table]


def _bytes_to_unicode() -> dict[int, str]:
    visible = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    codes = visible[:]
    extra = 0
    for byte in range(256):
        if byte not in visible:
            visible.append(byte)
            codes.append(256 + extra)
            extra += 1
    return dict(zip(visible, map(chr, codes), strict=True))


def make_chat_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL,
                                  initial_alphabet=_ascii_alphabet())
    tokenizer.train_from_iterator(CORPUS * 4, trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=PAD,
        clean_up_tokenization_spaces=False, chat_template=CHAT_TEMPLATE,
    )


def make_chat_model(directory: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """The tiny chat model and its tokenizer in ``directory`` (created), marked ``.complete``."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = make_chat_tokenizer()
    tokenizer.save_pretrained(path)
    config = tiny_config(len(tokenizer), tokenizer.eos_token_id)
    config.bos_token_id = tokenizer.bos_token_id
    random_model(config, seed).save_pretrained(path)
    (path / ".complete").write_bytes(b"")
    return path


def without_chat_template(source: Path, target: Path) -> Path:
    """A copy of the chat model at ``source`` whose tokenizer has no chat template."""
    import json
    import shutil

    shutil.copytree(source, target)
    (target / "chat_template.jinja").unlink(missing_ok=True)
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    return target


def template_ids(model_dir: Path, conversation: dict[str, Any], **kwargs: Any) -> list[int]:
    """What transformers' ``apply_chat_template(..., tokenize=True)`` gives the conversation."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    messages = conversation["messages"]
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    ids = tokenizer.apply_chat_template(messages, tools=conversation.get("tools"),
                                        add_generation_prompt=True, tokenize=True, **kwargs)
    if not isinstance(ids, list):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def greedy_ids(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list[str]:
    """transformers' own greedy answers to prompts given as token ids."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = load_causal_lm(model_dir, dtype=torch.float32).eval()
    answers = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens)
        answers.append(tokenizer.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True))
    return answers


# The tool-call chat model (Qwen2.5-style).

TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"

TOOL_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- else %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}"
    "{{- '\", \"arguments\": ' }}{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TOOL_CORPUS = [
    "You are a helpful assistant. You may call one or more functions to assist with the query.",
    '{"type": "function", "function": {"name": "calculator", "parameters": {"expression": 1}}}',
    "what is two plus two? the answer is four. what is 12 * 7? it is 84.",
    "system user assistant tool tools response arguments name description object string",
    "0123456789 +-*/()=.,:;!?'\"{}[]<>_ abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
]

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


def make_tool_chat_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=[PAD, BOS, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(TOOL_CORPUS * 4, trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,
    )
    fast.add_tokens([TOOL_CALL, TOOL_CALL_END])
    fast.chat_template = TOOL_CHAT_TEMPLATE
    return fast


def make_tool_chat_model(directory: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """A tiny chat Llama with the template above in ``directory`` (created), marked
    ``.complete``; generation ends at ``<|im_end|>`` or ``<|endoftext|>``."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tool_chat_tokenizer()
    tokenizer.save_pretrained(path)
    eos_ids = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(PAD)]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos_ids,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = random_model(config, seed)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(path)
    (path / ".complete").write_bytes(b"")
    return path


def greedy_chat(
    model_dir: str | os.PathLike[str], messages: list[dict[str, Any]], max_new_tokens: int
) -> str:
    """transformers' greedy answer to ``messages`` rendered by the snapshot's template (special
    tokens skipped, as a chat answer without tools is decoded)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = load_causal_lm(model_dir, dtype=torch.float32).eval()
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    prompt = rendered["input_ids"]
    with torch.inference_mode():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=max_new_tokens)
    return str(tokenizer.decode(out[0, prompt.shape[1]:], skip_special_tokens=True))


HOSTILE_CHATS = {
    "loop": "{%- for i in range(100000) %}{%- for j in range(100000) %}{%- endfor %}{%- endfor %}",
    "huge": "{{- 'x' * 10**9 }}",
    "long": "{{- 'x' * 5000000 }}",
    "recursion": "{%- macro deeper(n) %}{{- deeper(n + 1) }}{%- endmacro %}{{- deeper(0) }}",
    "range": "{{- range(10**6) | list | length }}",
}
"""What a hostile template does when the last message's content names it: loop for about ever,
build a string of a GB, render 5 MB of text, recurse without end, ask for a range past the
sandbox's."""
HOSTILE_TEMPLATE = (
    "{%- set last = messages[-1].content %}"
    + "".join(f"{{%- {'if' if i == 0 else 'elif'} last == '{name}' %}}{body}"
              for i, (name, body) in enumerate(HOSTILE_CHATS.items()))
    + "{%- else %}" + TOOL_CHAT_TEMPLATE + "{%- endif %}"
)
"""The tool chat template, behind the hostile branches of :data:`HOSTILE_CHATS`."""


def with_chat_template(source: Path, target: Path, template: str) -> Path:
    """A copy of the chat model at ``source`` whose tokenizer's chat template is ``template``."""
    import json
    import shutil

    shutil.copytree(source, target)
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    (target / "chat_template.jinja").write_text(template)
    return target

"""A tiny chat model for the OpenAI-API tests and benchmarks (a Qwen2.5-style template with
its tool prompt), made here: nothing comes from a model hub.

A Llama with random weights and a byte-level BPE tokenizer (every byte in its alphabet, so any
text encodes) whose chat template is Qwen2.5's, tools included, except that it begins with the
BOS, as Llama-3's does. The tokenizer also puts the BOS in front of plain text (its
post-processor), so a prompt rendered to text and tokenized again would carry two: the case the
engine must avoid by taking the rendered token ids as they are.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, LlamaConfig, PreTrainedTokenizerFast

from tests.models import random_model

BOS, EOS, IM_START, IM_END = "<|bos|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"

CHAT_TEMPLATE = (
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

CORPUS = [
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


def make_chat_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=[EOS, BOS, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=IM_END,
        pad_token=EOS,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,
    )
    fast.add_tokens([TOOL_CALL, TOOL_CALL_END])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_chat_model(directory: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """A tiny chat Llama with the template above in ``directory`` (created), marked
    ``.complete``; generation ends at ``<|im_end|>`` or ``<|endoftext|>``."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = make_chat_tokenizer()
    tokenizer.save_pretrained(path)
    eos_ids = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(EOS)]
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
    import torch
    from transformers import AutoTokenizer

    from actorsys.fleet.model_load import load_causal_lm

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = load_causal_lm(model_dir, dtype=torch.float32).eval()
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    prompt = rendered["input_ids"]
    with torch.inference_mode():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=max_new_tokens)
    return str(tokenizer.decode(out[0, prompt.shape[1]:], skip_special_tokens=True))

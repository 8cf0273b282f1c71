"""Log-probabilities as the OpenAI completions API reports them (``echo`` + ``logprobs``).

A prompt is scored in one forward pass of its own, unpadded, so every value is what
transformers computes for that sequence alone; lm-evaluation-harness reads its log-likelihoods
and greedy checks from these (``token_logprobs`` and ``top_logprobs`` past the context).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TokenLogprob:
    """One token and its log-probability given the tokens before it (None for a prompt's first
    token, which has no context), with the ``top`` most likely tokens at that position."""

    token_id: int
    logprob: float | None
    top: tuple[tuple[int, float], ...]


def at_position(logits: torch.Tensor, token_id: int, k: int) -> TokenLogprob:
    """``token_id``'s log-probability under ``logits`` (one position) and the top ``k``."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return TokenLogprob(token_id, float(logprobs[token_id]), _top(logprobs, k))


def score_prompt(model: Any, ids: Sequence[int], k: int) -> list[TokenLogprob]:
    """The log-probability of every token of ``ids`` given those before it, one forward pass."""
    return score_prompts(model, [ids], k)[0]


def score_prompts(model: Any, prompts: Sequence[Sequence[int]], k: int) -> list[list[TokenLogprob]]:
    """:func:`score_prompt` of prompts of one length, in one batched forward pass (the weight
    probe asks for several at once)."""
    inputs = torch.tensor([list(ids) for ids in prompts], dtype=torch.long)
    logits = model(input_ids=inputs, attention_mask=torch.ones_like(inputs)).logits
    results = []
    for ids, row_logits in zip(prompts, logits, strict=True):
        logprobs = torch.log_softmax(row_logits.float(), dim=-1)
        scored = [TokenLogprob(int(ids[0]), None, ())]
        for position in range(1, len(ids)):
            row = logprobs[position - 1]
            scored.append(TokenLogprob(int(ids[position]), float(row[ids[position]]), _top(row, k)))
        results.append(scored)
    return results


def _top(logprobs: torch.Tensor, k: int) -> tuple[tuple[int, float], ...]:
    if k <= 0:
        return ()
    values, indices = torch.topk(logprobs, k)
    return tuple((int(i), float(v)) for i, v in zip(indices.tolist(), values.tolist(), strict=True))


def openai_logprobs(
    tokens: Sequence[TokenLogprob], token_text: Callable[[int], str], text_offset: int = 0
) -> dict[str, Any]:
    """The ``choices[i].logprobs`` object of a completion: ``tokens``, ``token_logprobs``,
    ``top_logprobs`` (token text -> log-probability of the top tokens and of the token itself,
    as vLLM answers; None where there is no context) and ``text_offset``."""
    texts = [token_text(t.token_id) for t in tokens]
    offsets = []
    for text in texts:
        offsets.append(text_offset)
        text_offset += len(text)
    return {
        "tokens": texts,
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [
            None if t.logprob is None else {**{token_text(i): v for i, v in t.top}, text: t.logprob}
            for t, text in zip(tokens, texts, strict=True)
        ],
        "text_offset": offsets,
    }

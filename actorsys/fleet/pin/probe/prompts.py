"""The weight probe's fixed questions: its prompts and sequences, drawn from a snapshot's
vocabulary size alone, and the sampling and tolerance constants every side of the probe
shares (see :mod:`actorsys.fleet.pin.probe`)."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence

from actorsys._errors import ReferenceUnavailableError

PROBE_PROMPTS = 4
PROMPT_TOKENS = 8
PROBE_TOKENS = 6
PREFILL_SEQUENCES = PROBE_PROMPTS
"""How many :func:`probe_sequence` the prefill probe asks for (:func:`prefill_sequences`),
each ``PROMPT_TOKENS + PROBE_TOKENS - 1`` positions compared by their median. The engines
answer them after their load and before the evaluation may start, so their cost is on the
pin's critical path (on the CPU engine one sequence costs about half of four). Fewer are not
enough: an MoE model served with its previous experts differs from the snapshot by one to
six margins per position, and one sequence's median was exactly one margin (missed), two
sequences' 1.45, four's about 1.7."""
REL_MARGIN = 0.5
HALF_PRECISION_REL_MARGIN = 1.5
"""The relative margin where the snapshot's weights are 16-bit floats: the reference then
computes in that dtype and an engine may serve in another (float32 on the CPU engine), and
their logits differ by the rounding of 8 (bfloat16) or 11 (float16) significant bits at
every layer, measured up to about one standard deviation of the logits on tiny random
models."""
ABS_MARGIN = 1e-3
PROBE_SEED = 20261201

PROBE_SAMPLING = {
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "ignore_eos": True,
}
"""Sampling parameters of the weight probe: greedy, every penalty off (a model's generation
config may set some by default), end-of-sequence ignored."""


def probe_prompts(vocab_size: int) -> list[list[int]]:
    """The fixed probe prompts for a vocabulary: token ids drawn with a fixed seed from the
    lower part of the vocabulary, where every tokenizer has ordinary tokens (special tokens
    sit at its ends)."""
    high = min(vocab_size, 32000)
    low = high // 10
    rng = random.Random(PROBE_SEED)
    return [[rng.randrange(low, high) for _ in range(PROMPT_TOKENS)] for _ in range(PROBE_PROMPTS)]


def probe_sequence(prompt: Sequence[int]) -> list[int]:
    """The prefill probe's fixed sequence for one probe prompt: the prompt, then
    ``PROBE_TOKENS`` fixed tokens (the prompt's own, reversed: inside the vocabulary, and
    continuations no model favours, so every position tells)."""
    return [*prompt, *list(reversed(prompt))[:PROBE_TOKENS]]


def prefill_sequences(prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    """The prefill probe's sequences: :func:`probe_sequence` of the first
    ``PREFILL_SEQUENCES`` probe prompts."""
    return [probe_sequence(prompt) for prompt in prompts[:PREFILL_SEQUENCES]]


def read_probe_prompts(path: str) -> list[list[int]]:
    """The probe prompts for the snapshot at ``path``, from the vocabulary size in its
    ``config.json`` (or its ``text_config``). Raises :class:`ReferenceUnavailableError`
    where there is no readable config or no vocabulary size. Blocking: reads one small file."""
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise ReferenceUnavailableError(f"the snapshot {path} has no config.json")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise ReferenceUnavailableError(f"the config of the snapshot {path} is unreadable: {exc}") from exc
    for section in (config, config.get("text_config")) if isinstance(config, dict) else ():
        vocab = section.get("vocab_size") if isinstance(section, dict) else None
        if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0:
            return probe_prompts(vocab)
    raise ReferenceUnavailableError(f"the config of the snapshot {path} names no vocab_size")

"""The snapshot's own answer to the weight probe (the reference): what it is, how it is
computed from the snapshot's files (in the reference worker, :mod:`actorsys.fleet.pin.reference`,
never in the trainer's process), and where a pin gets it from."""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
from dataclasses import dataclass, field
from typing import Any, Protocol

from actorsys._errors import ReferenceFailedError  # noqa: F401 - defined there, imported from here
from actorsys.fleet.model_load import load_causal_lm
from actorsys.fleet.pin.probe.prompts import (
    ABS_MARGIN,
    HALF_PRECISION_REL_MARGIN,
    PROBE_TOKENS,
    REL_MARGIN,
    ReferenceUnavailableError,
    prefill_sequences,
    probe_prompts,
)


class ReferenceSource(Protocol):
    """Where a pin gets the snapshot's answer: :class:`actorsys.fleet.pin.reference.ReferenceWorker`,
    a worker process (never the pinning process itself)."""

    async def compute(self, path: str, prompts: list[list[int]]) -> Reference:
        """The snapshot's answer to ``prompts``; raises :class:`ReferenceFailedError`."""
        ...


NEAR_TOKENS = 16
"""Besides every near-tie, the reference keeps the gaps of this many best tokens per position
(so a mismatch reports the exact gap of a token the snapshot ranks among its first few)."""
NEAR_CAP = 4096
"""At most this many tokens per position are kept (a flatter distribution than that is
undecidable past them, and treated as a near-tie)."""


@dataclass(frozen=True)
class Reference:
    """The snapshot's greedy answer to the probe, small and free of torch (it travels from
    the reference worker by pickle): per prompt ``p`` and position ``i``, ``gaps[p][i]`` maps
    each token the snapshot ranks close to its choice (every near-tie, and the
    ``NEAR_TOKENS`` best) to how far below its choice it lies in log-probability, ``floors[p][i]``
    is a lower bound of the gap of every token not listed, and ``margins[p][i]`` is the
    near-tie margin there. ``prefill`` and ``prefill_margins`` are the same for the prefill
    probe: the log-probability of each token of the fixed sequence, and how far numerics may
    move it."""

    prompts: list[list[int]]
    tokens: list[list[int]]
    gaps: list[list[dict[int, float]]]
    floors: list[list[float]]
    margins: list[list[float]]
    vocab_size: int
    prefill: list[list[float]] = field(default_factory=list)
    """The log-probabilities of each token after the first of each of
    :func:`~actorsys.fleet.pin.probe.prompts.prefill_sequences` (empty where not computed)."""
    prefill_margins: list[list[float]] = field(default_factory=list)


def reference_from_logits(
    prompts: list[list[int]], logits: Any, *, rel_margin: float = REL_MARGIN
) -> Reference:
    """The :class:`Reference` of the snapshot logits ``logits`` (a float tensor of shape
    (prompts, positions, vocabulary)), whose argmax at each position is the snapshot's
    choice; ``rel_margin`` times the standard deviation of the logits is a near-tie."""
    import torch

    logprobs = torch.log_softmax(logits.float(), dim=-1)
    margins = rel_margin * logits.float().std(dim=-1) + ABS_MARGIN
    vocab = int(logprobs.shape[-1])
    keep = min(vocab, NEAR_CAP)
    best, order = logprobs.topk(keep, dim=-1)
    tokens: list[list[int]] = []
    gaps: list[list[dict[int, float]]] = []
    floors: list[list[float]] = []
    for p in range(logprobs.shape[0]):
        tokens.append([])
        gaps.append([])
        floors.append([])
        for i in range(logprobs.shape[1]):
            row_gaps = (best[p, i, 0] - best[p, i]).tolist()
            row_tokens = order[p, i].tolist()
            margin = float(margins[p, i])
            kept = {}
            for rank, (token, gap) in enumerate(zip(row_tokens, row_gaps, strict=True)):
                if rank >= NEAR_TOKENS and gap > margin:
                    floors[p].append(gap)
                    break
                kept[token] = gap
            else:
                floors[p].append(math.inf if keep == vocab else row_gaps[-1])
            tokens[p].append(row_tokens[0])
            gaps[p].append(kept)
    return Reference(
        prompts=[list(prompt) for prompt in prompts],
        tokens=tokens,
        gaps=gaps,
        floors=floors,
        margins=margins.tolist(),
        vocab_size=vocab,
    )


def compute_reference(path: str, prompts: list[list[int]] | None = None) -> Reference:
    """What the snapshot at ``path`` answers to the probe (``prompts``, default: those of its
    vocabulary). Raises :class:`ReferenceUnavailableError` where there is no ``config.json``
    or transformers cannot build the model. Blocking: maps the weights and decodes
    ``PROBE_TOKENS`` greedy tokens for a ``PROBE_PROMPTS`` batch (one prefill, then one
    token a step over a KV cache), then one forward of the prefill probe's sequences, in the
    snapshot's own dtype, in the calling process: the pipeline calls it only in the
    reference worker (:mod:`actorsys.fleet.pin.reference`), never in the trainer's process."""
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ReferenceUnavailableError(f"the snapshot {path} has no config.json")
    import torch
    from transformers import DynamicCache
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model = load_causal_lm(path, dtype="auto")
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ReferenceUnavailableError(f"transformers cannot build the snapshot {path}: {exc}") from exc
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    model.eval()
    if prompts is None:
        prompts = probe_prompts(int(model.config.vocab_size))
    ids = torch.tensor(prompts, dtype=torch.long)
    steps = []
    with torch.inference_mode():
        # Greedy with a KV cache, as the engines decode: each step a forward of one token,
        # not of the whole prefix again (which cost the reference five times the prefill's
        # work, competing with the engines for the host's CPUs while they load and answer).
        # The cache is ours and grows in place; transformers 5 names its argument ``cache``
        # (``past_key_values`` is deprecated), older releases ``past_key_values``.
        names = inspect.signature(model.forward).parameters
        cache = {"cache" if "cache" in names else "past_key_values": DynamicCache(config=model.config)}
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **cache)
        for step in range(PROBE_TOKENS):
            logits = out.logits[:, -1, :]
            steps.append(logits.float())
            if step + 1 < PROBE_TOKENS:
                out = model(input_ids=logits.argmax(-1, keepdim=True), use_cache=True,
                            logits_to_keep=1, **cache)
        sequences = torch.tensor(prefill_sequences(prompts), dtype=torch.long)
        full = model(input_ids=sequences, use_cache=False).logits[:, :-1, :].float()
    half = model.dtype in (torch.bfloat16, torch.float16)
    del model
    rel_margin = HALF_PRECISION_REL_MARGIN if half else REL_MARGIN
    reference = reference_from_logits(prompts, torch.stack(steps, dim=1), rel_margin=rel_margin)
    chosen = torch.log_softmax(full, dim=-1).gather(-1, sequences[:, 1:, None])[..., 0]
    return dataclasses.replace(
        reference,
        prefill=chosen.tolist(),
        prefill_margins=(rel_margin * full.std(dim=-1) + ABS_MARGIN).tolist(),
    )

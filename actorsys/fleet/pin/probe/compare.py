"""Judging the engines' answers to the weight probe against the snapshot's reference: the
prefill's log-probabilities within their margins, greedy tokens up to near-ties, and the
error of an engine that reads back the version but serves other weights."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from actorsys._errors import WeightsMismatchError
from actorsys.fleet.on_all import Named
from actorsys.fleet.pin.probe.reference_answer import Reference


@dataclass(frozen=True)
class PrefillAnswer:
    """An engine's answer to the prefill probe: ``logprobs[p][t]`` for the sequence ``p``'s
    token ``t + 1``."""

    logprobs: list[list[float]]


Answer = list[list[int]] | PrefillAnswer
"""An engine's answer to the probe: its greedy tokens per prompt, or a prefill's log-probabilities."""


def prefill_disagreement(
    reference: Reference, answer: PrefillAnswer
) -> tuple[int, int, float, float] | None:
    """Where the prefill ``answer`` differs from the snapshot's: None where the typical
    (median) difference over every position is within its margin; else the (sequence,
    position, difference, margin) of the widest. Numerics move a few positions by a margin's
    worth (more in 16-bit dtypes), other weights move almost all of them by several."""
    ratios: list[tuple[float, int, int, float, float]] = []
    for p, (ours, theirs) in enumerate(zip(reference.prefill, answer.logprobs, strict=True)):
        if len(theirs) != len(ours):
            return p, min(len(ours), len(theirs)), math.inf, 0.0
        for t, (mine, value) in enumerate(zip(ours, theirs, strict=True)):
            margin = reference.prefill_margins[p][t]
            gap = abs(mine - value) if math.isfinite(value) else math.inf
            ratios.append((gap / margin, p, t, gap, margin))
    if not ratios or statistics.median(r[0] for r in ratios) <= 1.0:
        return None
    _, p, t, gap, margin = max(ratios)
    return p, t, gap, margin


def first_disagreement(
    reference: Reference, answer: list[list[int]]
) -> tuple[int, int, float, float] | None:
    """The first (prompt, position, gap, margin) where ``answer`` takes a token the snapshot
    puts more than the margin below its own choice; None if there is none. ``gap`` is a
    lower bound where the token is not among those the reference lists."""
    for p, (ours, theirs) in enumerate(zip(reference.tokens, answer, strict=True)):
        for i, (mine, token) in enumerate(zip(ours, theirs, strict=False)):
            if mine == token:
                continue
            margin = reference.margins[p][i]
            if not 0 <= token < reference.vocab_size:
                return p, i, math.inf, margin
            gap = reference.gaps[p][i].get(token, reference.floors[p][i])
            if gap > margin:
                return p, i, gap, margin
            break
    return None


def judge(
    engines: Sequence[Named],
    answers: Sequence[Answer | None],
    reference: Reference,
    version: str,
) -> WeightsMismatchError | None:
    """The error of the first engine whose answer the snapshot clearly disagrees with; None
    if every answer (None: an engine not probed) agrees. Pure: runs on the caller's thread
    (a few hundred comparisons)."""
    for engine, answer in zip(engines, answers, strict=True):
        if answer is None:
            continue
        if isinstance(answer, PrefillAnswer):
            found = prefill_disagreement(reference, answer)
            if found is not None:
                prompt, position, gap, margin = found
                return WeightsMismatchError(
                    engine.name, version, answer=answer.logprobs, reference=reference.prefill,
                    prompt=prompt, position=position, gap=gap, margin=margin, prefill=True,
                )
            continue
        found = first_disagreement(reference, answer)
        if found is not None:
            prompt, position, gap, margin = found
            return WeightsMismatchError(
                engine.name,
                version,
                answer=answer,
                reference=reference.tokens,
                prompt=prompt,
                position=position,
                gap=gap,
                margin=margin,
            )
    return None

"""Judging the engines' answers to the weight probe against the snapshot's reference: the
prefill's log-probabilities within their margins, greedy tokens up to near-ties, and the
error of an engine that reads back the version but serves other weights."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from actorsys.fleet.on_all import Named, PinError, PinViolationError
from actorsys.fleet.pin.probe.reference_answer import Reference


@dataclass(frozen=True)
class PrefillAnswer:
    """An engine's answer to the prefill probe: ``logprobs[p][t]`` for the sequence ``p``'s
    token ``t + 1``."""

    logprobs: list[list[float]]


Answer = list[list[int]] | PrefillAnswer
"""An engine's answer to the probe: its greedy tokens per prompt, or a prefill's log-probabilities."""


class WeightsMismatchError(PinViolationError):
    """An engine reads back the right version but computes something the snapshot does not.

    ``answer`` is the engine's greedy tokens for each probe prompt, ``reference`` the
    snapshot's; ``prompt`` and ``position`` locate the first clear disagreement, ``gap`` is
    how far (in log-probability) the snapshot puts the engine's token below its own choice
    there, and ``margin`` what a near-tie may be. For an engine probed by prefill
    (``prefill``), ``answer`` and ``reference`` are the log-probabilities of the fixed
    continuation, and ``prompt``, ``position``, ``gap`` locate their widest difference.
    """

    def __init__(
        self,
        engine: str,
        version: str,
        *,
        answer: list[list[int]] | list[list[float]],
        reference: list[list[int]] | list[list[float]],
        prompt: int,
        position: int,
        gap: float,
        margin: float,
        prefill: bool = False,
    ) -> None:
        if prefill:
            detail = (
                f"probe sequence {prompt}: the engine's log-probabilities of the fixed "
                f"continuation {_rounded(answer[prompt])}, the snapshot's "
                f"{_rounded(reference[prompt])} (token {position} differs by {gap:.3g}; "
                f"numerics may move one by {margin:.3g})"
            )
        else:
            detail = (
                f"probe prompt {prompt}, token {position}: the engine answered "
                f"{answer[prompt]}, the snapshot answers {reference[prompt]} (the engine's "
                f"token is {gap:.3g} below the snapshot's choice in log-probability; a "
                f"near-tie is within {margin:.3g})"
            )
        PinError.__init__(
            self,
            engine,
            f"reads back version {version!r} but does not serve its weights: {detail}",
        )
        self.prefill = prefill
        self.expected = version
        self.actual = version
        self.answer = answer
        self.reference = reference
        self.prompt = prompt
        self.position = position
        self.gap = gap
        self.margin = margin


def _rounded(values: Sequence[float | int]) -> list[float | int]:
    return [round(v, 2) if isinstance(v, float) else v for v in values]


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

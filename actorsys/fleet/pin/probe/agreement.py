"""Judging a shared fleet's engines by each other: there is no snapshot to compute a
reference from (the trainer loaded the weights itself), so every engine's answer to the
fixed probe must agree with the other engines', and a strict majority decides.

Two prefill answers (the log-probabilities of the same fixed sequences) agree where the
median difference over their positions is within ``REL_MARGIN`` times the spread of the
log-probabilities (plus ``ABS_MARGIN``): the probe's tokens are not ones the model favours,
so their log-probabilities spread as the model's logits do, and that spread stands in for
the ``std(logits)`` a reference would give (:mod:`actorsys.fleet.pin.probe`). Engines that
serve the same weights differ by numerics, far below it; engines that serve other weights
differ by about the spread itself at every position. Two greedy answers (engines that
cannot answer a prefill) agree where at least half of the prompts' continuations are the
same token for token: a near-tie may send one prompt another way, other weights send
every prompt another way. Answers of the two kinds are not compared.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from actorsys._errors import EnginesDisagreeError
from actorsys.fleet.on_all import Named
from actorsys.fleet.pin.probe.compare import Answer, PrefillAnswer
from actorsys.fleet.pin.probe.prompts import ABS_MARGIN, REL_MARGIN

__all__ = ["EnginesDisagreeError", "agree", "disagreement"]


def agree(a: Answer, b: Answer) -> bool | None:
    """Whether two engines' answers are those of the same weights; None where they cannot
    be compared (one prefill, one greedy; or different shapes of one kind)."""
    if isinstance(a, PrefillAnswer) and isinstance(b, PrefillAnswer):
        return _prefills_agree(a, b)
    if isinstance(a, PrefillAnswer) or isinstance(b, PrefillAnswer):
        return None
    if len(a) != len(b) or not a:
        return None
    same = sum(1 for x, y in zip(a, b, strict=True) if list(x) == list(y))
    return 2 * same >= len(a)


def _prefills_agree(a: PrefillAnswer, b: PrefillAnswer) -> bool | None:
    if [len(row) for row in a.logprobs] != [len(row) for row in b.logprobs]:
        return None
    gaps: list[float] = []
    values: list[float] = []
    for mine, theirs in zip(a.logprobs, b.logprobs, strict=True):
        for x, y in zip(mine, theirs, strict=True):
            finite = math.isfinite(x) and math.isfinite(y)
            gaps.append(abs(x - y) if finite else math.inf)
            values.extend(v for v in (x, y) if math.isfinite(v))
    if not gaps:
        return None
    spread = statistics.pstdev(values) if len(values) > 1 else 0.0
    return statistics.median(gaps) <= REL_MARGIN * spread + ABS_MARGIN


def disagreement(
    engines: Sequence[Named], answers: Sequence[Answer | None], version: str
) -> EnginesDisagreeError | None:
    """The error of a shared fleet whose engines (``answers[i]`` is ``engines[i]``'s; None: an
    engine not probed) do not answer alike: the engines outside the largest group that
    agrees within itself and holds a strict majority of the answering engines are the
    dissenters; without such a group, every answering engine is named. None where they
    agree, or where fewer than two answers can be compared. Pure; a few hundred numbers."""
    named = [(engine.name, answer) for engine, answer in zip(engines, answers, strict=True)
             if answer is not None]
    if len(named) < 2:
        return None
    n = len(named)
    verdicts = {
        (i, j): agree(named[i][1], named[j][1]) for i in range(n) for j in range(i + 1, n)
    }

    def agrees(i: int, j: int) -> bool | None:
        return True if i == j else verdicts[(min(i, j), max(i, j))]

    comparable = [i for i in range(n) if any(agrees(i, j) is not None for j in range(n) if j != i)]
    if len(comparable) < 2:
        return None
    groups = [
        [j for j in comparable if agrees(i, j)] for i in comparable
    ]
    # A group counts only where every member agrees with every other (a clique), so one
    # engine that half-agrees with two camps cannot join them into a majority.
    cliques = [g for g in groups if all(agrees(x, y) for x in g for y in g)]
    best = max(cliques, key=len, default=[])
    if 2 * len(best) > len(comparable):
        dissenters = [named[i][0] for i in comparable if i not in best]
        if not dissenters:
            return None
        majority = ", ".join(named[i][0] for i in best)
        return EnginesDisagreeError(
            version, dissenters,
            f"{', '.join(map(repr, dissenters))} answer the probe unlike the majority "
            f"({majority}): they serve other weights under that version",
        )
    everyone = [named[i][0] for i in comparable]
    return EnginesDisagreeError(
        version, everyone,
        f"no strict majority of {len(everyone)} engines answers the probe alike, so which "
        "weights the version names cannot be told",
    )

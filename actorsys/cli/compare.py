"""Whether step B differs from step A beyond chance: a paired test per dataset over the prompts
both points scored.

The two points answer the same prompts, so each prompt's difference is measured against itself:
a prompt's samples are averaged first (they are correlated), the prompts both points scored are
matched by their text, and the per-prompt differences ``B - A`` go through the paired t-test
(:func:`scipy.stats.ttest_rel`). The paired t-test is the right one here: the mean of a few
hundred bounded per-prompt differences is close to normal (the central limit theorem), and it
needs no assumption of independence between A's and B's answers to one prompt, which a test of
two means would (and whose error bars would be far wider, the prompts' difficulty counted twice).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Comparison:
    """One dataset's paired comparison: ``prompts`` scored by both points, the mean per-prompt
    scores ``a`` and ``b`` over them, ``difference`` (``b - a``), its standard error and the
    two-sided p-value of "no difference" (NaN with fewer than two prompts)."""

    dataset: str
    prompts: int
    a: float
    b: float
    difference: float
    stderr: float
    p_value: float


def prompt_means(records: Iterable[Any]) -> dict[str, float]:
    """Each prompt's mean score over its samples (records ``{"prompt", "score", ...}``, as
    ``outcome.data["samples"][name]`` keeps them); records without a text prompt or a number
    score are left out."""
    scores: dict[str, list[float]] = {}
    for record in records:
        if not isinstance(record, Mapping):
            continue
        prompt, score = record.get("prompt"), record.get("score")
        if isinstance(prompt, str) and isinstance(score, int | float) and not isinstance(score, bool) \
                and math.isfinite(score):
            scores.setdefault(prompt, []).append(float(score))
    return {prompt: sum(values) / len(values) for prompt, values in scores.items()}


def compare(a: Mapping[str, Sequence[Any]], b: Mapping[str, Sequence[Any]]) -> list[Comparison]:
    """The paired comparison of every dataset both ``a`` and ``b`` (``data["samples"]`` of
    two points) scored on at least one common prompt, in name order."""
    from scipy import stats

    found = []
    for name in sorted(set(a) & set(b)):
        means_a, means_b = prompt_means(a[name]), prompt_means(b[name])
        common = [prompt for prompt in means_a if prompt in means_b]
        if not common:
            continue
        xs = [means_a[p] for p in common]
        ys = [means_b[p] for p in common]
        differences = [y - x for x, y in zip(xs, ys, strict=True)]
        difference = sum(differences) / len(differences)
        stderr = statistics.stdev(differences) / math.sqrt(len(common)) if len(common) > 1 else 0.0
        if len(common) < 2:
            p_value = math.nan
        elif stderr == 0.0:
            # every prompt moved by the same amount: t is infinite (or 0/0 with no change),
            # where scipy answers NaN
            p_value = 1.0 if difference == 0.0 else 0.0
        else:
            p_value = float(stats.ttest_rel(ys, xs).pvalue)
        found.append(Comparison(name, len(common), sum(xs) / len(xs), sum(ys) / len(ys),
                                difference, stderr, p_value))
    return found

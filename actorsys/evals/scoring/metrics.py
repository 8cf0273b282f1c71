"""The metrics of one dataset's samples, named as miles names them.

- ``eval/<name>``: the mean score over every sample (a failed request scores 0).
- ``eval/<name>/pass@<k>``: the unbiased estimator of the chance that at least one of ``k``
  samples of a prompt is correct, averaged over prompts, for k = 1, 2, 4, ... up to
  ``n_samples``, and ``n_samples`` itself. A sample is correct when it scores 1.
- ``eval/<name>/maj@<n>`` (``n_samples`` > 1, scorers that extract an answer): the share of
  prompts whose most frequent extracted answer (the first to reach that count on a tie) is
  correct; a prompt none of whose samples yields an answer counts as wrong.
- ``eval/<name>/stderr``, ``eval/<name>/pass@<k>/stderr``, ``eval/<name>/maj@<n>/stderr``: the
  standard error of each of those means over prompts (:func:`prompt_stderr`). A prompt's
  samples are averaged first, since they are correlated (they answer the same question), so
  the error is clustered by prompt: ``stdev(per-prompt values, ddof=1) / sqrt(prompts)``, 0
  for one prompt.
- ``eval/<name>/response_len/mean``: mean completion tokens of the answered samples (left out
  when the engine reports no usage).
- ``eval/<name>/truncated_ratio``: the share of answered samples that stopped at
  ``max_tokens`` (finish reason ``length``) or whose ``max_tokens`` was cut to fit the
  model's context.
- ``eval/<name>/errors``: requests that failed after their retries, or were refused (a
  prompt too long for the context is one, never sent).
- ``eval/<name>/scorer_errors``: answers whose scorer raised or overran ``score_timeout``
  (scored 0).
- ``eval/<name>/samples``: how many samples were drawn.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Sample:
    """One answer to one prompt, scored. ``error`` is why it has no answer (or why its scorer
    failed); such a sample scores 0. ``cut``: its ``max_tokens`` was cut to fit the context."""

    prompt: str
    answer: str
    label: Any
    score: float
    finish_reason: str | None = None
    completion_tokens: int | None = None
    error: str | None = None
    request_failed: bool = False
    cut: bool = False

    def as_record(self) -> dict[str, Any]:
        """What ``outcome.data["samples"][name]`` keeps of it."""
        record = {"prompt": self.prompt, "answer": self.answer, "label": self.label,
                  "score": self.score}
        if self.error is not None:
            record["error"] = self.error
        return record


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The unbiased pass@k estimator of Chen et al. (2021): ``1 - C(n-c, k) / C(n, k)``, the
    chance that ``k`` of ``n`` samples drawn without replacement hold at least one of the
    ``correct`` ones."""
    if not 0 <= correct <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 0 <= correct <= n and 1 <= k <= n, got {n=}, "
                         f"{correct=}, {k=}")
    if n - correct < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - correct + 1, n + 1))


def prompt_stderr(per_prompt: Sequence[float]) -> float:
    """The standard error of the mean of ``per_prompt`` (one value a prompt: its samples'
    mean score, or its pass@k estimate): ``stdev(per_prompt, ddof=1) / sqrt(len)``, 0 for
    one prompt. :func:`statistics.stdev` computes it exactly (in fractions), so the same values
    give the same error bit for bit wherever it is recomputed."""
    if len(per_prompt) < 2:
        return 0.0
    return statistics.stdev(per_prompt) / math.sqrt(len(per_prompt))


def pass_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to ``n``, and ``n``."""
    ks = []
    k = 1
    while k <= n:
        ks.append(k)
        k *= 2
    if ks[-1] != n:
        ks.append(n)
    return ks


def majority_correct(samples: Sequence[Sample], votes: Sequence[str | None]) -> float:
    """1 if the most frequent answer among ``votes`` (the first to reach the top count on a
    tie) is correct (its first sample scores 1), else 0; 0 where nothing was extracted."""
    counted = Counter(vote for vote in votes if vote is not None)
    if not counted:
        return 0.0
    winner = counted.most_common(1)[0][0]
    first = next(s for s, vote in zip(samples, votes, strict=True) if vote == winner)
    return float(first.score >= 1.0)


def dataset_metrics(
    name: str,
    samples: Sequence[Sample],
    n_samples: int,
    votes: Sequence[str | None] | None = None,
) -> dict[str, float]:
    """The metrics of ``samples``, ``n_samples`` consecutive samples per prompt; ``votes``
    (one per sample: the answer it extracts, or None) adds ``maj@<n_samples>``."""
    if not samples or len(samples) % n_samples:
        raise ValueError(f"{name}: expected {n_samples} samples per prompt, got {len(samples)}")
    prefix = f"eval/{name}"
    metrics: dict[str, float] = {prefix: sum(s.score for s in samples) / len(samples)}
    groups = [samples[i : i + n_samples] for i in range(0, len(samples), n_samples)]
    metrics[f"{prefix}/stderr"] = prompt_stderr(
        [sum(s.score for s in group) / n_samples for group in groups]
    )
    correct = [sum(1 for s in group if s.score >= 1.0) for group in groups]
    for k in pass_ks(n_samples):
        estimates = [pass_at_k(n_samples, c, k) for c in correct]
        metrics[f"{prefix}/pass@{k}"] = sum(estimates) / len(estimates)
        metrics[f"{prefix}/pass@{k}/stderr"] = prompt_stderr(estimates)
    if votes is not None and n_samples > 1:
        if len(votes) != len(samples):
            raise ValueError(f"{name}: expected one vote per sample, got {len(votes)}")
        wins = [
            majority_correct(group, votes[i : i + n_samples])
            for group, i in zip(groups, range(0, len(samples), n_samples), strict=True)
        ]
        metrics[f"{prefix}/maj@{n_samples}"] = sum(wins) / len(wins)
        metrics[f"{prefix}/maj@{n_samples}/stderr"] = prompt_stderr(wins)
    answered = [s for s in samples if not s.request_failed]
    lengths = [s.completion_tokens for s in answered if s.completion_tokens is not None]
    if lengths:
        metrics[f"{prefix}/response_len/mean"] = sum(lengths) / len(lengths)
    truncated = sum(1 for s in answered if s.finish_reason == "length" or s.cut)
    metrics[f"{prefix}/truncated_ratio"] = truncated / len(answered) if answered else 0.0
    metrics[f"{prefix}/errors"] = float(len(samples) - len(answered))
    metrics[f"{prefix}/scorer_errors"] = float(
        sum(1 for s in answered if s.error is not None)
    )
    metrics[f"{prefix}/samples"] = float(len(samples))
    return metrics

"""Sampling and scoring datasets on a pinned fleet: the one definition both
:class:`~actorsys.evals.DatasetEval` (a pipeline's fleet) and
:class:`~actorsys.evals.ServerEvalFn` (an external server) evaluate with.

Every prompt is sent ``n_samples`` times through ``fleet.complete``, which bounds the requests
in flight, gives each a deadline, retries failures and checks the version of every answer. A
request that still fails scores 0 and is counted in ``eval/<name>/errors``; a scorer that
raises, or takes longer than the dataset's ``score_timeout``, scores its answer 0 and is
counted in ``eval/<name>/scorer_errors``. Only if every
request of the evaluation failed is the point skipped (``unhealthy``): a score of 0 from a
dead fleet would read as a real result.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from actorsys._errors import ConfigError
from actorsys.contracts import EvalSkip, RolloutFnEvalOutput
from actorsys.evals.datasets import EvalDataset
from actorsys.evals.metrics import Sample, dataset_metrics
from actorsys.evals.scoring_pool import score_in_workers
from actorsys.fleet.completions import Completion

log = logging.getLogger("actorsys.evals")


class CompletingFleet(Protocol):
    """What sampling needs of a fleet: :meth:`actorsys.Fleet.complete`."""

    async def complete(
        self,
        prompts: Sequence[str],
        *,
        max_tokens: int = ...,
        temperature: float = ...,
        concurrency: int = ...,
        request_timeout: float = ...,
        extra: Any = ...,
        retries: int = ...,
        keep_failures: bool = ...,
    ) -> list[Completion]: ...


def check_datasets(owner: str, datasets: EvalDataset | Sequence[EvalDataset]) -> list[EvalDataset]:
    """``datasets`` as a list of uniquely named datasets; raises :class:`ConfigError`."""
    items = [datasets] if isinstance(datasets, EvalDataset) else list(datasets)
    if not items or not all(isinstance(d, EvalDataset) for d in items):
        raise ConfigError(
            f"{owner}(datasets)",
            "expected an EvalDataset or a non-empty sequence of them "
            "(EvalDataset.from_jsonl, load_eval_config, datasets_from_args)",
        )
    names = [d.name for d in items]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"{owner}(datasets)", f"dataset names must be unique; {duplicates} repeat")
    return items


def check_limits(owner: str, concurrency: object, retries: object) -> None:
    for name, value, minimum in (("concurrency", concurrency, 1), ("retries", retries, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{owner}({name})", f"expected an integer >= {minimum}, got {value!r}")


async def evaluate_datasets(
    fleet: CompletingFleet,
    datasets: Sequence[EvalDataset],
    *,
    concurrency: int,
    request_timeout: float,
    retries: int,
) -> RolloutFnEvalOutput:
    """Sample and score every dataset on ``fleet``; the metrics and
    ``data["samples"][name]`` (prompt, answer, label, score per sample).

    Raises :class:`EvalSkip` (``unhealthy``) if every request failed, and lets the fleet's
    ``pin_violation`` (a stale answer) through. Blocks on the engines, then on scoring in
    worker processes (killed if cancelled); the caller's cancel scope bounds both.
    """
    answers: list[list[Completion]] = []
    for dataset in datasets:
        prompts = [prompt for prompt in dataset.prompts for _ in range(dataset.n_samples)]
        answers.append(
            await fleet.complete(
                prompts,
                concurrency=concurrency,
                request_timeout=request_timeout,
                retries=retries,
                keep_failures=True,
                **dataset.sampling_kwargs(),
            )
        )
    failed = [a for batch in answers for a in batch if a.error is not None]
    total = sum(len(batch) for batch in answers)
    if failed and len(failed) == total:
        raise EvalSkip("unhealthy", f"all {total} requests failed; the first: {failed[0].error}")
    scored = [await score_answers(d, batch) for d, batch in zip(datasets, answers, strict=True)]
    metrics: dict[str, float] = {}
    samples: dict[str, list[dict[str, Any]]] = {}
    for dataset, batch_samples in zip(datasets, scored, strict=True):
        metrics.update(dataset_metrics(dataset.name, batch_samples, dataset.n_samples))
        samples[dataset.name] = [sample.as_record() for sample in batch_samples]
    return RolloutFnEvalOutput(data={"samples": samples}, metrics=metrics)


async def score_answers(dataset: EvalDataset, answers: Sequence[Completion]) -> list[Sample]:
    """Score ``answers`` (``n_samples`` per record, in record order) in the scoring workers,
    each within ``dataset.score_timeout`` (see :mod:`actorsys.evals.scoring_pool`)."""
    records = [dataset.records[index // dataset.n_samples] for index in range(len(answers))]
    pass_record = callable(dataset.scorer)
    answered = [index for index, answer in enumerate(answers) if answer.error is None]
    scores = await score_in_workers(
        dataset.scorer,
        [
            (answers[i].text, records[i][dataset.label_key], records[i] if pass_record else None)
            for i in answered
        ],
        score_timeout=dataset.score_timeout,
    )
    by_index = dict(zip(answered, scores, strict=True))
    failures = [scored.error for scored in scores if scored.error is not None]
    if failures:
        log.warning("%s: %s (scored 0; %d answers counted in scorer_errors)", dataset.name,
                    failures[0], len(failures))
    samples = []
    for index, answer in enumerate(answers):
        prompt, label = records[index][dataset.input_key], records[index][dataset.label_key]
        if answer.error is not None:
            samples.append(Sample(prompt, "", label, 0.0, error=answer.error, request_failed=True))
            continue
        scored = by_index[index]
        samples.append(
            Sample(prompt, answer.text, label, scored.value, answer.finish_reason,
                   answer.completion_tokens, scored.error)
        )
    return samples

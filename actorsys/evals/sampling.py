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
from functools import partial
from typing import Any, Protocol

from actorsys._errors import ConfigError
from actorsys.contracts import EvalSkip, RolloutFnEvalOutput
from actorsys.evals.context_fit import Fit, fit_datasets
from actorsys.evals.datasets import EvalDataset
from actorsys.evals.metrics import Sample, dataset_metrics
from actorsys.evals.scoring_pool import score_in_workers
from actorsys.fleet.completions import Completion
from actorsys.runtime import run_in_eval_thread

log = logging.getLogger("actorsys.evals")


class CompletingFleet(Protocol):
    """What sampling needs of a fleet: :meth:`actorsys.Fleet.complete`."""

    async def complete(
        self,
        prompts: Sequence[str],
        *,
        max_tokens: int | Sequence[int] = ...,
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
    checkpoint_dir: str | None = None,
) -> RolloutFnEvalOutput:
    """Sample and score every dataset on ``fleet``; the metrics and
    ``data["samples"][name]`` (prompt, answer, label, score per sample). With
    ``checkpoint_dir`` (the snapshot the fleet serves), requests are fitted to its context
    (:mod:`actorsys.evals.context_fit`).

    Raises :class:`EvalSkip` if every request failed: ``bad_request`` if the server refused
    them all (a 4xx; the first message is the detail), else ``unhealthy``; and lets the fleet's
    ``pin_violation`` (a stale answer) through. Blocks on the engines, then on scoring in
    worker processes (killed if cancelled); the caller's cancel scope bounds both.
    """
    fits = None
    if checkpoint_dir is not None:
        fits = await run_in_eval_thread(
            partial(fit_datasets, checkpoint_dir, datasets),
            abandon_on_cancel=True,
            description=f"fitting requests to the context of {checkpoint_dir}",
        )
    answers: list[list[Completion]] = []
    cuts: list[list[bool]] = []
    for index, dataset in enumerate(datasets):
        batch, cut = await _sample(
            fleet, dataset, None if fits is None else fits[index], concurrency=concurrency,
            request_timeout=request_timeout, retries=retries,
        )
        answers.append(batch)
        cuts.append(cut)
    failed = [a for batch in answers for a in batch if a.error is not None]
    total = sum(len(batch) for batch in answers)
    if failed and len(failed) == total:
        reason = "bad_request" if all(a.bad_request for a in failed) else "unhealthy"
        raise EvalSkip(reason, f"all {total} requests failed; the first: {failed[0].error}")
    scored = [
        await score_answers(d, batch, cut)
        for d, batch, cut in zip(datasets, answers, cuts, strict=True)
    ]
    metrics: dict[str, float] = {}
    samples: dict[str, list[dict[str, Any]]] = {}
    for dataset, batch_samples in zip(datasets, scored, strict=True):
        metrics.update(dataset_metrics(dataset.name, batch_samples, dataset.n_samples))
        samples[dataset.name] = [sample.as_record() for sample in batch_samples]
    return RolloutFnEvalOutput(data={"samples": samples}, metrics=metrics)


async def _sample(
    fleet: CompletingFleet,
    dataset: EvalDataset,
    fits: Sequence[Fit] | None,
    *,
    concurrency: int,
    request_timeout: float,
    retries: int,
) -> tuple[list[Completion], list[bool]]:
    """Every prompt of ``dataset`` ``n_samples`` times, each asking for what ``fits`` leaves
    it (a prompt that fills the context alone is not sent: a failed, bad request); the
    answers in order, and whether each one's ``max_tokens`` was cut."""
    per_sample = [
        (prompt, None if fits is None else fits[p])
        for p, prompt in enumerate(dataset.prompts)
        for _ in range(dataset.n_samples)
    ]
    sent = [i for i, (_, fit) in enumerate(per_sample) if fit is None or fit.max_tokens is not None]
    limits = [dataset.max_tokens if fit is None or fit.max_tokens is None else fit.max_tokens
              for _, fit in per_sample]
    settings = dataset.sampling_kwargs()
    if any(limits[i] != dataset.max_tokens for i in sent):
        settings["max_tokens"] = [limits[i] for i in sent]
    got = iter(
        await fleet.complete(
            [per_sample[i][0] for i in sent],
            concurrency=concurrency,
            request_timeout=request_timeout,
            retries=retries,
            keep_failures=True,
            **settings,
        )
        if sent else []
    )
    answers = []
    for index, (prompt, fit) in enumerate(per_sample):
        if fit is not None and fit.max_tokens is None:
            answers.append(Completion(index, prompt, "", None, None, "", error=fit.refusal,
                                      bad_request=True))
        else:
            answers.append(next(got))
    return answers, [fit is not None and fit.cut for _, fit in per_sample]


async def score_answers(
    dataset: EvalDataset, answers: Sequence[Completion], cut: Sequence[bool] | None = None
) -> list[Sample]:
    """Score ``answers`` (``n_samples`` per record, in record order) in the scoring workers,
    each within ``dataset.score_timeout`` (see :mod:`actorsys.evals.scoring_pool`); ``cut``
    marks the answers whose ``max_tokens`` was cut to fit the context."""
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
                   answer.completion_tokens, scored.error, cut=bool(cut and cut[index]))
        )
    return samples

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
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Protocol

from actorsys._errors import ConfigError
from actorsys._flags import require_int
from actorsys.contracts import EvalSkip, RolloutFnEvalOutput
from actorsys.evals.data.dataset import EvalDataset
from actorsys.evals.data.prompts import DatasetPrompts, Prompt, prepare_prompts
from actorsys.evals.scoring.grading import Grader, grading_input
from actorsys.evals.scoring.metrics import Sample, dataset_metrics
from actorsys.evals.scoring.pool import Item, score_in_workers, warm_workers
from actorsys.evals.scoring.scorers import (
    EXTRACTING,
    Scorer,
    base_scorer,
    extracted_answer,
    needs_math,
)
from actorsys.fleet.chat_template import warm_renderer
from actorsys.fleet.clients.completions import Completion
from actorsys.runtime import run_in_eval_thread

PLAIN_SCORERS = frozenset({"exact", "numeric", "math", "choice"})
"""Scorers that need nothing of a record but its label (sent to the workers as they are)."""

log = logging.getLogger("actorsys.evals")


class CompletingFleet(Protocol):
    """What sampling needs of a fleet: :meth:`actorsys.Fleet.complete`."""

    async def complete(
        self,
        prompts: Sequence[Prompt],
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
    require_int(f"{owner}(concurrency)", concurrency, minimum=1)
    require_int(f"{owner}(retries)", retries, minimum=0)


async def evaluate_datasets(
    fleet: CompletingFleet,
    datasets: Sequence[EvalDataset],
    *,
    concurrency: int,
    request_timeout: float,
    retries: int,
    checkpoint_dir: str | None = None,
    step: int | None = None,
) -> RolloutFnEvalOutput:
    """Sample and score every dataset on ``fleet`` (with ``step``: every dataset due at it,
    :meth:`EvalDataset.due <actorsys.evals.EvalDataset.due>`; the others are named in
    ``data["not_due"]``); the metrics and
    ``data["samples"][name]`` (prompt, answer, label, score per sample). With
    ``checkpoint_dir`` (the snapshot the fleet serves), chat prompts are rendered by its chat
    template and requests are fitted to its context (:mod:`actorsys.evals.data.prompts`); a chat
    dataset without it skips ``no_chat_template``.

    Raises :class:`EvalSkip` if every request failed: ``bad_request`` if the server refused
    them all (a 4xx; the first message is the detail), else ``unhealthy``; and lets the fleet's
    ``pin_violation`` (a stale answer) through. Blocks on the engines, then on scoring in
    worker processes (killed if cancelled); the caller's cancel scope bounds both.
    """
    datasets, not_due = due_datasets(datasets, step)
    if not datasets:
        return not_due_output(not_due)
    if checkpoint_dir is None:
        prepared = prepare_prompts(None, datasets)
    else:
        prepared = await run_in_eval_thread(
            partial(prepare_prompts, checkpoint_dir, datasets),
            abandon_on_cancel=True,
            description=f"rendering and fitting the prompts for {checkpoint_dir}",
        )
    answers: list[list[Completion]] = []
    cuts: list[list[bool]] = []
    for dataset, prompts in zip(datasets, prepared, strict=True):
        batch, cut = await _sample(
            fleet, dataset, prompts, concurrency=concurrency,
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
        await score_answers(d, batch, cut, prompts.shown)
        for d, batch, cut, prompts in zip(datasets, answers, cuts, prepared, strict=True)
    ]
    metrics: dict[str, float] = {}
    samples: dict[str, list[dict[str, Any]]] = {}
    for dataset, batch_samples in zip(datasets, scored, strict=True):
        votes = await majority_votes(dataset, batch_samples)
        metrics.update(dataset_metrics(dataset.name, batch_samples, dataset.n_samples, votes))
        samples[dataset.name] = [sample.as_record() for sample in batch_samples]
    data: dict[str, Any] = {"samples": samples}
    if not_due:
        data["not_due"] = not_due
    return RolloutFnEvalOutput(data=data, metrics=metrics)


def due_datasets(
    datasets: Sequence[EvalDataset], step: int | None
) -> tuple[list[EvalDataset], list[str]]:
    """The datasets of ``datasets`` due at ``step`` (all where it is None), and the names of
    the others. A dataset not due is no failure: the point is ok without it, and it is not
    evaluated again at that step (the watch ledger settles the checkpoint ``ok``)."""
    if step is None:
        return list(datasets), []
    due = [d for d in datasets if d.due(step)]
    return due, [d.name for d in datasets if not d.due(step)]


def not_due_output(not_due: Sequence[str]) -> RolloutFnEvalOutput:
    """What a point evaluates where no dataset is due at its step: ok, with no score."""
    return RolloutFnEvalOutput(data={"samples": {}, "not_due": list(not_due)}, metrics={})


async def _sample(
    fleet: CompletingFleet,
    dataset: EvalDataset,
    prompts: DatasetPrompts,
    *,
    concurrency: int,
    request_timeout: float,
    retries: int,
) -> tuple[list[Completion], list[bool]]:
    """Every prompt of ``dataset`` ``n_samples`` times (as ``prompts`` sends it: text or
    token ids), each asking for what its fit leaves it (a prompt that fills the context
    alone, or that the template refused, is not sent: a failed, bad request); the answers in
    order, and whether each one's ``max_tokens`` was cut."""
    fits = prompts.fits
    per_sample = [p for p in range(len(dataset.records)) for _ in range(dataset.n_samples)]

    def refusal(p: int) -> str | None:
        if prompts.refusals[p] is not None:
            return prompts.refusals[p]
        if fits is not None and fits[p].max_tokens is None:
            return fits[p].refusal
        return None

    sent = [i for i, p in enumerate(per_sample) if refusal(p) is None]
    limits = [dataset.max_tokens if fits is None or fits[p].max_tokens is None
              else fits[p].max_tokens for p in per_sample]
    settings = dataset.sampling_kwargs()
    if any(limits[i] != dataset.max_tokens for i in sent):
        settings["max_tokens"] = [limits[i] for i in sent]
    got = iter(
        await fleet.complete(
            [prompts.sent[per_sample[i]] for i in sent],  # type: ignore[misc]
            concurrency=concurrency,
            request_timeout=request_timeout,
            retries=retries,
            keep_failures=True,
            **settings,
        )
        if sent else []
    )
    answers = []
    for index, p in enumerate(per_sample):
        why = refusal(p)
        if why is not None:
            answers.append(Completion(index, prompts.shown[p], "", None, None, "", error=why,
                                      bad_request=True))
        else:
            answers.append(next(got))
    return answers, [fits is not None and fits[p].cut for p in per_sample]


def pool_scorer(dataset: EvalDataset) -> Scorer | Grader:
    """What scores ``dataset``'s answers in the workers: its scorer as it is where it needs
    nothing of a record but its label (or is a callable, which gets the record), else a
    :class:`~actorsys.evals.scoring.grading.Grader` (records' own ``rm_type``, ``remote_rm``, dotted
    paths)."""
    if dataset.metadata_key is None and (
        callable(dataset.scorer) or dataset.scorer in PLAIN_SCORERS
    ):
        return dataset.scorer
    return Grader(
        dataset.scorer, dataset.rm_url, dataset.score_timeout,
        math=any(needs_math(dataset.scorer_of(r)) for r in range(len(dataset.records))),
    )


async def warm_scorers(datasets: Sequence[EvalDataset]) -> None:
    """Start and warm the scoring workers for ``datasets`` (see
    :func:`~actorsys.evals.scoring.pool.warm_workers`), so that the first point's scoring pays
    no worker start; what an eval fn that scores datasets runs when its supervisor opens.
    With a chat dataset it starts the render worker too (in the background)."""
    if any(dataset.apply_chat_template for dataset in datasets):
        warm_renderer()
    await warm_workers([pool_scorer(dataset) for dataset in datasets])


class ScorerWarmUp:
    """The warm-up of an eval fn that scores ``datasets``: the supervisor runs ``_warm_up`` in
    the background when it opens (close cancels it), so that the first point pays no worker
    start (:func:`warm_scorers`)."""

    datasets: Sequence[EvalDataset]

    async def _warm_up(self) -> None:
        await warm_scorers(self.datasets)


async def score_answers(
    dataset: EvalDataset,
    answers: Sequence[Completion],
    cut: Sequence[bool] | None = None,
    shown: Sequence[str] | None = None,
) -> list[Sample]:
    """Score ``answers`` (``n_samples`` per record, in record order) in the scoring workers,
    each within ``dataset.score_timeout`` (see :mod:`actorsys.evals.scoring.pool`), each by
    its record's scorer; ``cut`` marks the answers whose ``max_tokens`` was cut to fit the
    context; ``shown`` is each record's prompt as the model was given it (the rendered chat
    prompt), which samples keep (default: the record's prompt)."""
    n = dataset.n_samples
    record_of = [index // n for index in range(len(answers))]
    prompts = list(shown) if shown is not None else [str(p) for p in dataset.prompts]
    label_key = dataset.label_key
    answered = [index for index, answer in enumerate(answers) if answer.error is None]
    scorer = pool_scorer(dataset)

    def item(index: int) -> Item:
        r = record_of[index]
        record = dataset.records[r]
        travels: Mapping[str, Any] | None
        if isinstance(scorer, Grader):
            travels = grading_input(record, dataset.metadata(r), prompts[r])
        else:
            travels = record if callable(scorer) else None
        return answers[index].text, record[label_key], travels

    items = [item(index) for index in answered]
    scores = await score_in_workers(scorer, items, score_timeout=dataset.score_timeout)  # type: ignore[arg-type]
    by_index = dict(zip(answered, scores, strict=True))
    failures = [scored.error for scored in scores if scored.error is not None]
    if failures:
        log.warning("%s: %s (scored 0; %d answers counted in scorer_errors)", dataset.name,
                    failures[0], len(failures))
    samples = []
    for index, answer in enumerate(answers):
        prompt = prompts[record_of[index]]
        label = dataset.records[record_of[index]][label_key]
        if answer.error is not None:
            samples.append(Sample(prompt, "", label, 0.0, error=answer.error, request_failed=True))
            continue
        scored = by_index[index]
        samples.append(
            Sample(prompt, answer.text, label, scored.value, answer.finish_reason,
                   answer.completion_tokens, scored.error, cut=bool(cut and cut[index]))
        )
    return samples


async def majority_votes(dataset: EvalDataset, samples: Sequence[Sample]) -> list[str | None] | None:
    """The answer each sample votes for in ``maj@n`` (what its record's scorer extracts), or
    None where the metric does not apply (one sample per prompt, or a scorer that grades no
    single extracted answer). Regular expressions over every answer: run in a worker
    thread."""
    n = dataset.n_samples
    scorers = [dataset.scorer_of(r) for r in range(len(dataset.records))]
    if n < 2 or not all(isinstance(s, str) and base_scorer(s) in EXTRACTING for s in scorers):
        return None

    def extract() -> list[str | None]:
        return [
            None if sample.request_failed
            else extracted_answer(scorers[i // n], sample.answer, dataset.metadata(i // n))
            for i, sample in enumerate(samples)
        ]

    return await run_in_eval_thread(extract, abandon_on_cancel=True,
                                    description=f"{dataset.name}: extracting answers for maj@{n}")

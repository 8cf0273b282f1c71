"""The standard errors of a dataset's metrics: clustered by prompt, on known distributions."""

from __future__ import annotations

import math
import statistics

import pytest

from actorsys import RolloutFnEvalInput
from actorsys.evals import DatasetEval, EvalDataset
from actorsys.evals.harnesses.lm_eval_tasks import output_of
from actorsys.evals.scoring.metrics import Sample, dataset_metrics, pass_at_k, prompt_stderr
from tests.fakes import ScriptedFleet


def samples(scores: list[list[float]]) -> list[Sample]:
    return [Sample(f"p{i}", "a", "a", score) for i, group in enumerate(scores) for score in group]


def test_the_stderr_of_a_binomial_mean_is_its_textbook_value() -> None:
    # 200 prompts, one sample each, 124 right: p(1-p)/(n-1) under ddof=1
    metrics = dataset_metrics("math", samples([[1.0]] * 124 + [[0.0]] * 76), 1)
    p = 124 / 200
    assert metrics["eval/math"] == p
    assert metrics["eval/math/stderr"] == pytest.approx(math.sqrt(p * (1 - p) / 199))
    assert metrics["eval/math/pass@1/stderr"] == metrics["eval/math/stderr"]


def test_a_prompts_samples_are_averaged_before_the_error_is_taken() -> None:
    # two prompts, four samples each: the per-prompt means are 1.0 and 0.25
    scores = [[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]]
    metrics = dataset_metrics("qa", samples(scores), 4)
    assert metrics["eval/qa/stderr"] == statistics.stdev([1.0, 0.25]) / math.sqrt(2)
    # not the error of eight independent samples, which is smaller
    assert metrics["eval/qa/stderr"] > statistics.stdev([s for g in scores for s in g]) / math.sqrt(8)
    for k in (1, 2, 4):
        estimates = [pass_at_k(4, 4, k), pass_at_k(4, 1, k)]
        assert metrics[f"eval/qa/pass@{k}/stderr"] == statistics.stdev(estimates) / math.sqrt(2)
    assert metrics["eval/qa/pass@4/stderr"] == 0.0  # both prompts are solved within 4


def test_one_prompt_has_a_stderr_of_zero() -> None:
    metrics = dataset_metrics("one", samples([[1.0, 0.0, 1.0]]), 3)
    assert metrics["eval/one/stderr"] == 0.0
    assert metrics["eval/one/pass@2/stderr"] == 0.0
    assert prompt_stderr([]) == prompt_stderr([0.7]) == 0.0


def test_majority_voting_gets_the_error_of_its_per_prompt_wins() -> None:
    scores = [[1.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 1.0]]
    votes = ["4", "4", "5", "7", "7", "9", "1", "1", "1"]
    metrics = dataset_metrics("m", samples(scores), 3, votes)
    assert metrics["eval/m/maj@3"] == pytest.approx(2 / 3)
    assert metrics["eval/m/maj@3/stderr"] == statistics.stdev([1.0, 0.0, 1.0]) / math.sqrt(3)


async def test_dataset_eval_reports_the_stderr_of_every_mean_it_reports() -> None:
    correct = {"p0": 0, "p1": 1, "p2": 3, "p3": 4}
    fleet = ScriptedFleet(lambda prompt, k: "yes" if k < correct[prompt] else "no")
    records = tuple({"prompt": p, "label": "yes"} for p in correct)
    data = EvalDataset(name="qa", records=records, n_samples=4, temperature=1.0)
    point = RolloutFnEvalInput(rollout_id=1, weight_version="1", hf_dir="/ckpt", fleet=fleet)
    output = await DatasetEval([data]).evaluate_checkpoint("/ckpt", point)
    metrics = output.metrics
    assert metrics is not None
    means = [c / 4 for c in correct.values()]
    assert metrics["eval/qa/stderr"] == statistics.stdev(means) / 2
    assert {k for k in metrics if k.endswith("/stderr")} == {
        "eval/qa/stderr", "eval/qa/pass@1/stderr", "eval/qa/pass@2/stderr", "eval/qa/pass@4/stderr"
    }


def test_lm_evals_own_stderr_is_named_after_its_metric() -> None:
    results = {"results": {"gsm8k": {
        "exact_match,strict-match": 0.25, "exact_match_stderr,strict-match": 0.125,
        "acc,none": 0.5, "acc_stderr,none": 0.05, "_stderr,none": 1.0,
    }}}
    assert output_of(results, log_samples=False).metrics == {
        "eval/gsm8k/exact_match/strict-match": 0.25,
        "eval/gsm8k/exact_match/strict-match/stderr": 0.125,
        "eval/gsm8k/acc": 0.5,
        "eval/gsm8k/acc/stderr": 0.05,
        "eval/gsm8k/_stderr": 1.0,
    }

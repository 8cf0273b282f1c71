"""DatasetEval's own logic on a scripted fleet: metrics, pass@k, errors, skips."""

from __future__ import annotations

from math import comb

import pytest

from actorsys import ConfigError, EvalSkip, RolloutFnEvalInput
from actorsys._errors import ConfigTypeError
from actorsys.evals import DatasetEval, EvalDataset
from actorsys.evals.scoring.metrics import pass_at_k, pass_ks
from tests.fakes import ScriptedFleet


def dataset(name: str, pairs: list[tuple[str, str]], **settings: object) -> EvalDataset:
    records = tuple({"prompt": p, "label": label} for p, label in pairs)
    return EvalDataset(name=name, records=records, **settings)  # type: ignore[arg-type]


def point(fleet: object) -> RolloutFnEvalInput:
    return RolloutFnEvalInput(rollout_id=1, weight_version="1", hf_dir="/ckpt", fleet=fleet)


def hand_pass_at_k(n: int, c: int, k: int) -> float:
    return 1.0 - comb(n - c, k) / comb(n, k)


async def test_pass_at_k_on_a_known_answer_distribution_is_the_unbiased_estimator() -> None:
    correct = {"p0": 0, "p1": 1, "p2": 3, "p3": 4}
    fleet = ScriptedFleet(lambda prompt, k: "yes" if k < correct[prompt] else "no")
    data = dataset("qa", [(p, "yes") for p in correct], n_samples=4, temperature=1.0)
    output = await DatasetEval([data]).evaluate_checkpoint("/ckpt", point(fleet))
    metrics = output.metrics
    assert metrics is not None
    for k in (1, 2, 4):
        expected = sum(hand_pass_at_k(4, c, k) for c in correct.values()) / 4
        assert metrics[f"eval/qa/pass@{k}"] == pytest.approx(expected)
    assert "eval/qa/pass@3" not in metrics
    assert metrics["eval/qa"] == pytest.approx(8 / 16)
    assert metrics["eval/qa/samples"] == 16
    assert fleet.calls[0]["prompts"] == [p for p in correct for _ in range(4)]
    assert fleet.calls[0]["temperature"] == 1.0


async def test_each_dataset_gets_its_own_n_and_sampling_settings() -> None:
    fleet = ScriptedFleet(lambda prompt, k: "a" if k % 2 == 0 else "b")
    one = dataset("one", [("x", "a")], n_samples=1, max_tokens=8)
    three = dataset("three", [("y", "a")], n_samples=3, max_tokens=16, top_p=0.9, stop=("\n",))
    output = await DatasetEval([one, three], concurrency=5).evaluate_checkpoint("/", point(fleet))
    metrics = output.metrics
    assert metrics is not None
    assert sorted(k for k in metrics if "pass@" in k and not k.endswith("/stderr")) == [
        "eval/one/pass@1", "eval/three/pass@1", "eval/three/pass@2", "eval/three/pass@3"
    ]
    assert metrics["eval/one/pass@1"] == 1.0
    assert metrics["eval/three/pass@1"] == pytest.approx(2 / 3)
    assert metrics["eval/three/pass@2"] == pytest.approx(hand_pass_at_k(3, 2, 2))
    first, second = fleet.calls
    assert (first["max_tokens"], first["concurrency"], first["keep_failures"]) == (8, 5, True)
    assert (second["max_tokens"], second["extra"]) == (16, {"top_p": 0.9, "stop": ["\n"]})


async def test_samples_are_kept_with_prompt_answer_label_and_score() -> None:
    fleet = ScriptedFleet(lambda prompt, k: " 4 " if prompt == "2+2" else "5")
    data = dataset("arith", [("2+2", "4"), ("2+3", "6")], scorer="numeric")
    output = await DatasetEval(data).evaluate_checkpoint("/", point(fleet))
    assert output.data["samples"]["arith"] == [
        {"prompt": "2+2", "answer": " 4 ", "label": "4", "score": 1.0},
        {"prompt": "2+3", "answer": "5", "label": "6", "score": 0.0},
    ]
    assert output.metrics is not None
    assert output.metrics["eval/arith/response_len/mean"] == 3.0
    assert output.metrics["eval/arith/truncated_ratio"] == 0.0


async def test_failed_requests_score_zero_and_are_counted() -> None:
    fleet = ScriptedFleet(lambda prompt, k: None if prompt == "down" else "ok")
    data = dataset("d", [("up", "ok"), ("down", "ok")], n_samples=2)
    output = await DatasetEval(data).evaluate_checkpoint("/", point(fleet))
    metrics = output.metrics
    assert metrics is not None
    assert (metrics["eval/d"], metrics["eval/d/errors"], metrics["eval/d/pass@2"]) == (0.5, 2.0, 0.5)
    assert output.data["samples"]["d"][2] == {
        "prompt": "down", "answer": "", "label": "ok", "score": 0.0, "error": "down"
    }


async def test_every_request_failing_skips_the_point_unhealthy_rather_than_scoring_zero() -> None:
    fleet = ScriptedFleet(lambda prompt, k: None)
    evaluation = DatasetEval([dataset("a", [("x", "1")]), dataset("b", [("y", "1")])])
    with pytest.raises(EvalSkip) as caught:
        await evaluation.evaluate_checkpoint("/", point(fleet))
    assert caught.value.reason == "unhealthy"
    assert "all 2 requests failed" in str(caught.value)


async def test_a_scorer_that_raises_scores_that_sample_zero_and_is_counted() -> None:
    def picky(answer: str, label: object, record: dict) -> float:
        if answer == "boom":
            raise RuntimeError("cannot grade")
        return 1.0

    fleet = ScriptedFleet(lambda prompt, k: "boom" if prompt == "b" else "fine")
    data = dataset("s", [("a", "1"), ("b", "1")], scorer=picky)
    output = await DatasetEval(data).evaluate_checkpoint("/", point(fleet))
    assert output.metrics is not None
    assert (output.metrics["eval/s"], output.metrics["eval/s/scorer_errors"]) == (0.5, 1.0)
    assert output.metrics["eval/s/errors"] == 0.0
    assert "cannot grade" in output.data["samples"]["s"][1]["error"]


async def test_a_stale_answer_skips_the_point_as_pin_violation() -> None:
    fleet = ScriptedFleet(lambda prompt, k: "x", stale_version="0")
    with pytest.raises(EvalSkip) as caught:
        await DatasetEval(dataset("d", [("x", "x")])).evaluate_checkpoint("/", point(fleet))
    assert caught.value.reason == "pin_violation"


async def test_without_a_fleet_the_error_says_what_to_use() -> None:
    with pytest.raises(TypeError, match="ServerEvalFn"):
        await DatasetEval(dataset("d", [("x", "x")])).evaluate_checkpoint("/", point(None))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"datasets": []}, "non-empty sequence"),
        ({"datasets": ["data.jsonl"]}, "expected an EvalDataset"),
        ({"concurrency": 0}, "concurrency"),
        ({"request_timeout": 0}, "request_timeout"),
        ({"retries": -1}, "retries"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs: dict, message: str) -> None:
    arguments = {"datasets": [dataset("d", [("x", "x")])], **kwargs}
    with pytest.raises(ConfigError, match=message):
        DatasetEval(**arguments)


def test_two_datasets_of_one_name_are_refused() -> None:
    with pytest.raises(ConfigError, match="unique"):
        DatasetEval([dataset("d", [("x", "x")]), dataset("d", [("y", "y")])])


def test_pass_at_k_matches_the_closed_form_and_the_ks_double_up_to_n() -> None:
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(hand_pass_at_k(n, c, k))
    assert pass_ks(1) == [1]
    assert pass_ks(4) == [1, 2, 4]
    assert pass_ks(6) == [1, 2, 4, 6]


async def test_without_the_pipelines_fleet_it_is_a_config_type_error() -> None:
    eval_fn = DatasetEval([dataset("math", [("1+1", "2")])])
    with pytest.raises(ConfigTypeError, match="pass fleet= to EvalSupervisor.open") as raised:
        await eval_fn.evaluate_checkpoint("/ckpt", point(None))
    assert raised.value.field == "EvalSupervisor.open(fleet)"

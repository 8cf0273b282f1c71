"""Per-dataset intervals: a dataset is evaluated only at steps that are a multiple of its own."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from actorsys import RolloutFnEvalInput
from actorsys.evals import DatasetError, DatasetEval, EvalDataset, load_eval_config
from tests.evals.test_server_logic import Scripted
from tests.fakes import ScriptedFleet


def dataset(name: str, **settings: object) -> EvalDataset:
    records = ({"prompt": f"{name}?", "label": "yes"},)
    return EvalDataset(name=name, records=records, **settings)  # type: ignore[arg-type]


def point(step: int, fleet: object) -> RolloutFnEvalInput:
    return RolloutFnEvalInput(rollout_id=step, weight_version=str(step), hf_dir="/c", fleet=fleet)


async def test_each_dataset_runs_only_at_the_multiples_of_its_interval() -> None:
    fleet = ScriptedFleet(lambda prompt, k: "yes")
    fn = DatasetEval([dataset("cheap"), dataset("every2", interval=2), dataset("every3", interval=3)])
    seen = {}
    for step in range(7):
        fleet.calls.clear()
        output = await fn.evaluate_checkpoint("/c", point(step, fleet))
        assert output.metrics is not None
        seen[step] = sorted(k.split("/")[1] for k in output.metrics if k.count("/") == 1)
        asked = sorted(p.removesuffix("?") for call in fleet.calls for p in call["prompts"])
        assert asked == seen[step], "a dataset not due was still sampled"
        assert output.data.get("not_due", []) == [
            name for name in ("every2", "every3") if name not in seen[step]
        ]
    assert seen == {
        0: ["cheap", "every2", "every3"], 1: ["cheap"], 2: ["cheap", "every2"],
        3: ["cheap", "every3"], 4: ["cheap", "every2"], 5: ["cheap"], 6: ["cheap", "every2", "every3"],
    }


async def test_a_step_where_no_dataset_is_due_is_ok_without_asking_the_fleet() -> None:
    fleet = ScriptedFleet(lambda prompt, k: "yes")
    output = await DatasetEval([dataset("rare", interval=10)]).evaluate_checkpoint(
        "/c", point(5, fleet)
    )
    assert fleet.calls == []
    assert output.metrics == {}
    assert output.data == {"samples": {}, "not_due": ["rare"]}


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "10"])
def test_an_interval_that_is_not_a_positive_integer_is_refused_naming_the_field(bad: object) -> None:
    with pytest.raises(DatasetError, match="interval") as caught:
        dataset("x", interval=bad)
    assert isinstance(caught.value, ValueError)
    assert caught.value.key == "interval"


def test_the_eval_config_key_interval_sets_it_and_enters_the_fingerprint(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(json.dumps({"prompt": "q", "label": "a"}) + "\n")
    config = tmp_path / "eval.yaml"
    config.write_text("datasets:\n  - {name: aime, path: a.jsonl, interval: 10}\n"
                      "  - {name: math, path: a.jsonl}\n")
    aime, math = load_eval_config(config)
    assert (aime.interval, math.interval) == (10, None)
    assert EvalDataset.from_jsonl(tmp_path / "a.jsonl", interval=4).interval == 4
    # a dataset without an interval keeps the fingerprint it had before intervals existed
    assert math.fingerprint() == EvalDataset.from_jsonl(tmp_path / "a.jsonl", name="math").fingerprint()
    assert aime.fingerprint() != EvalDataset.from_jsonl(tmp_path / "a.jsonl", name="aime").fingerprint()
    config.write_text("datasets:\n  - {name: aime, path: a.jsonl, interval: 0}\n")
    with pytest.raises(DatasetError, match=r"eval.yaml.*line 2.*interval"):
        load_eval_config(config)


async def test_server_eval_fn_neither_readies_nor_pins_its_server_at_a_step_nothing_is_due() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"the server was asked {request.url.path} at a step nothing is due")

    evaluation = Scripted(refuse)
    evaluation.datasets = [dataset("rare", interval=10)]
    output = await evaluation.evaluate_checkpoint("/ckpt", point(7, None))
    assert output.metrics == {} and output.data == {"samples": {}, "not_due": ["rare"]}
    assert evaluation.recorder.requests == []

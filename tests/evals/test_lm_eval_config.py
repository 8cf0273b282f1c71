"""LmEvalTasks' arguments, its metric names, its snapshot checks off the trio thread, and
importing actorsys without lm-eval."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from actorsys import ConfigError, EvalSkip, Fleet, LmEvalTasks, RolloutFnEvalInput, SGLangEngine
from actorsys.evals.harnesses.lm_eval_tasks import output_of


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.slow
def test_importing_actorsys_never_imports_lm_eval_and_works_without_it() -> None:
    loaded = run_python("import sys, actorsys; print('lm_eval' in sys.modules)")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "False"
    missing = run_python(
        "import sys; sys.modules['lm_eval'] = None\n"
        "import actorsys\n"
        "try:\n"
        "    actorsys.LmEvalTasks('arc_easy')\n"
        "except actorsys.ConfigError as exc:\n"
        "    print(exc)\n"
    )
    assert missing.returncode == 0, missing.stderr
    assert "pip install 'actorsys[lm-eval]'" in missing.stdout


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"tasks": []}, "tasks"),
        ({"tasks": ["ok", 3]}, "tasks"),
        ({"num_fewshot": -1}, "num_fewshot"),
        ({"limit": 0}, "limit"),
        ({"limit": 1.5}, "limit"),
        ({"num_concurrent": 0}, "num_concurrent"),
        ({"gen_kwargs": 3}, "gen_kwargs"),
        ({"include_path": "/no/such/tasks"}, "include_path"),
        ({"request_timeout": 0}, "request_timeout"),
    ],
)
def test_bad_arguments_raise_config_error_naming_the_field(
    arguments: dict[str, Any], field: str
) -> None:
    arguments = {"tasks": "arc_easy", **arguments}
    with pytest.raises(ConfigError) as raised:
        LmEvalTasks(**arguments)
    assert raised.value.field == field


def test_arguments_are_kept_as_lm_eval_takes_them(tmp_path: Path) -> None:
    fn = LmEvalTasks("arc_easy", include_path=tmp_path, limit=0.5, gen_kwargs={"max_gen_toks": 4})
    assert fn.tasks == ("arc_easy",)
    assert fn.include_path == str(tmp_path)
    assert fn.limit == 0.5
    assert LmEvalTasks(["a", "b"], limit=10.0).limit == 10
    assert fn.gen_kwargs == {"max_gen_toks": 4}


def test_metrics_are_named_by_task_metric_and_filter_other_than_none() -> None:
    results = {
        "results": {
            "gsm8k": {
                "alias": "gsm8k",
                "exact_match,strict-match": 0.25,
                "exact_match_stderr,strict-match": 0.1,
                "exact_match,flexible-extract": 0.5,
            },
            "arc_easy": {"acc,none": 0.75, "acc_stderr,none": "N/A", "acc_norm,none": float("nan")},
        },
        "groups": {"mmlu": {"acc,none": 0.4}},
        "versions": {"gsm8k": 3},
        "n-samples": {"gsm8k": {"original": 1319, "effective": 4}},
        "samples": {"gsm8k": [{"doc_id": 0}]},
    }
    output = output_of(results, log_samples=False)
    assert output.metrics == {
        "eval/gsm8k/exact_match/strict-match": 0.25,
        "eval/gsm8k/exact_match/strict-match/stderr": 0.1,
        "eval/gsm8k/exact_match/flexible-extract": 0.5,
        "eval/arc_easy/acc": 0.75,
        "eval/mmlu/acc": 0.4,
    }
    assert output.data == {
        "lm_eval": {"versions": {"gsm8k": 3}, "n_samples": {"gsm8k": {"original": 1319, "effective": 4}}}
    }
    assert output_of(results, log_samples=True).data["samples"] == {"gsm8k": [{"doc_id": 0}]}


async def test_a_snapshot_without_a_tokenizer_is_skipped_before_any_request(tmp_path: Path) -> None:
    fleet = Fleet([SGLangEngine("http://127.0.0.1:9")])
    point = RolloutFnEvalInput(1, "1", str(tmp_path), fleet)
    with pytest.raises(EvalSkip) as raised:
        await LmEvalTasks("arc_easy").evaluate_checkpoint(str(tmp_path), point)
    assert raised.value.reason == "ckpt_invalid"
    assert "base_checkpoint" in str(raised.value)


async def test_the_snapshots_files_are_checked_off_the_trio_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trio_thread, threads = threading.get_ident(), []
    real_exists = os.path.exists

    def exists(path: Any) -> bool:
        if os.fspath(path).startswith(str(tmp_path)):
            threads.append(threading.get_ident())
        return real_exists(path)

    monkeypatch.setattr(os.path, "exists", exists)
    fleet = Fleet([SGLangEngine("http://127.0.0.1:9")])
    with pytest.raises(EvalSkip):
        await LmEvalTasks("arc_easy").evaluate_checkpoint(
            str(tmp_path), RolloutFnEvalInput(1, "1", str(tmp_path), fleet)
        )
    assert threads and trio_thread not in threads


async def test_evaluating_without_a_fleet_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        await LmEvalTasks("arc_easy").evaluate_checkpoint(str(tmp_path), RolloutFnEvalInput(1))
    assert raised.value.field == "fleet"

"""Scoring in worker processes: an answer that hangs its scorer scores 0 within
``score_timeout`` while the trio loop runs on; callables travel by pickling; autojump waits."""

from __future__ import annotations

import os
import threading
import time
from functools import partial
from pathlib import Path

import pytest
import trio

from actorsys import ConfigError
from actorsys.evals import DatasetEval, EvalDataset, load_eval_config
from actorsys.evals.scoring.pool import score_in_workers
from tests.evals.conftest import running
from tests.evals.test_dataset_eval import point
from tests.fakes import ScriptedFleet

TOWER = "\\boxed{9^{9^{9^{9}}}}"


async def ticking(ticks: list[float]) -> None:
    while True:
        ticks.append(time.monotonic())
        await trio.sleep(0.05)


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_an_answer_that_hangs_sympy_scores_zero_within_score_timeout_while_trio_runs() -> None:
    ticks: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticking, ticks)
        await score_in_workers("math", [("\\boxed{1}", "1", None)], score_timeout=30.0)  # warm
        started = time.monotonic()
        scored = await score_in_workers(
            "math", [("\\boxed{2}", "2", None), (TOWER, "2", None)], score_timeout=3.0
        )
        elapsed = time.monotonic() - started
        nursery.cancel_scope.cancel()
    assert scored[0].value == 1.0 and scored[0].error is None
    assert scored[1].value == 0.0
    assert "took longer than score_timeout=3.0 s" in (scored[1].error or "")
    # The chunk of both overran once, then the tower alone: two budgets and a worker start.
    assert 3.0 <= elapsed < 2 * 3.0 + 15.0
    during = [b - a for a, b in zip(ticks, ticks[1:], strict=False) if a >= started]
    assert during and max(during) < 1.0, "the trio loop stalled while the scorer hung"


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_cancelling_a_scoring_call_kills_the_hung_worker(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"

    def tower(answer: str, label: object, record: dict) -> float:
        pid_file.write_text(str(os.getpid()))
        return float(pow(9, 9 ** int(answer)) == 0)  # one C call that holds the GIL for minutes

    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(score_in_workers, tower, [("9", "2", {})], score_timeout=600.0))
        while not pid_file.exists() or not pid_file.read_text():  # noqa: ASYNC110 - a worker process writes it
            await trio.sleep(0.05)
        await trio.sleep(0.5)
        cancelled = time.monotonic()
        nursery.cancel_scope.cancel()
    assert time.monotonic() - cancelled < 2.0
    pid = int(pid_file.read_text())
    assert pid != os.getpid()
    assert running([pid]) == []


async def test_callable_scorers_run_in_another_process_with_their_record() -> None:
    parent = os.getpid()

    def elsewhere(answer: str, label: object, record: dict) -> float:
        return float(os.getpid() != parent and record["id"] == answer)

    fleet = ScriptedFleet(lambda prompt, k: prompt)
    records = ({"prompt": "a", "label": 1, "id": "a"}, {"prompt": "b", "label": 1, "id": "c"})
    data = EvalDataset(name="where", records=records, scorer=elsewhere)
    output = await DatasetEval(data).evaluate_checkpoint("/", point(fleet))
    assert [s["score"] for s in output.data["samples"]["where"]] == [1.0, 0.0]


def test_a_scorer_that_cannot_be_pickled_is_refused_at_construction() -> None:
    lock = threading.Lock()

    def locked(answer: str, label: object, record: dict) -> float:
        with lock:
            return 1.0

    with pytest.raises(ConfigError) as caught:
        EvalDataset(name="d", records=({"prompt": "p", "label": "l"},), scorer=locked)
    assert caught.value.field == "scorer"
    assert "cannot be pickled" in str(caught.value)
    assert "module-level function" in str(caught.value)


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), "10"])
def test_score_timeout_must_be_positive_seconds(value: object) -> None:
    with pytest.raises(ConfigError, match="score_timeout"):
        EvalDataset(name="d", records=({"prompt": "p", "label": "l"},), score_timeout=value)  # type: ignore[arg-type]


def test_score_timeout_is_part_of_the_fingerprint() -> None:
    records = ({"prompt": "p", "label": "l"},)
    assert (EvalDataset(name="d", records=records).fingerprint()
            != EvalDataset(name="d", records=records, score_timeout=5.0).fingerprint())


async def test_scoring_holds_an_autojump_clock_so_no_deadline_expires_meanwhile(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fleet = ScriptedFleet(lambda prompt, k: "4")
    data = EvalDataset(name="m", records=({"prompt": "2+2", "label": "4"},) * 40, scorer="numeric")
    before = trio.current_time()
    with trio.fail_after(1.0):
        output = await DatasetEval(data).evaluate_checkpoint("/", point(fleet))
    assert output.metrics is not None and output.metrics["eval/m"] == 1.0
    assert trio.current_time() == before


def test_score_timeout_is_a_key_of_eval_config_datasets_and_defaults(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text('{"prompt": "p", "label": "l"}\n')
    (tmp_path / "eval.yaml").write_text(
        "defaults: {score_timeout: 4}\n"
        "datasets:\n  - {name: a, path: d.jsonl}\n  - {name: b, path: d.jsonl, score_timeout: 2.5}\n"
    )
    assert [d.score_timeout for d in load_eval_config(tmp_path / "eval.yaml")] == [4, 2.5]

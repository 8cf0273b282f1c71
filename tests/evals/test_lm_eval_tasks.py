"""LmEvalTasks on real CPU engines, against lm-eval's own ``hf`` model on the same snapshots.

The tasks are local YAMLs over local JSONL (tests/data/lm_eval): a generation task whose
answers are what transformers generates greedily from snapshot 1 (so its score separates the
snapshots) and a multiple-choice task scored by log-likelihoods. Nothing is downloaded
(tests/conftest.py sets HF_HUB_OFFLINE and HF_DATASETS_OFFLINE).
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from actorsys import (
    EvalConfig,
    EvalSkip,
    EvalSupervisor,
    Fleet,
    MemorySink,
    Outcome,
    RolloutFnEvalInput,
    SGLangEngine,
)
from actorsys.evals import LmEvalTasks
from actorsys.evals._door.gate import VERSION_HEADER, RequestGate
from actorsys.fleet.local import LocalFleet, embedded, free_port
from tests.fleet.pipeline import evaluate_served
from tests.models import greedy, make_model, make_snapshot

# Models made once for the module: its tests share one worker.
pytestmark = pytest.mark.xdist_group("evals/test_lm_eval_tasks")

DATA = Path(__file__).parent.parent / "data" / "lm_eval"
TASKS = ["tiny_gen", "tiny_mc"]
GEN_PROMPTS = [
    "the quick brown", "engines load", "one two three", "a trainer hands",
    "every point", "structured concurrency", "the lazy dog", "five six",
]
GEN_STOP = "o"


@dataclass(frozen=True)
class LmEvalSetup:
    base: Path
    snapshots: dict[int, Path]
    tasks: Path


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> LmEvalSetup:
    root = tmp_path_factory.mktemp("lm_eval")
    make_model(root / "base", seed=0)
    snapshots = {step: root / f"step{step}" for step in (1, 2)}
    for step, path in snapshots.items():
        make_snapshot(root / "base", path, seed=step)
    tasks = root / "tasks"
    tasks.mkdir()
    shutil.copy(DATA / "tiny_mc.jsonl", tasks)
    answers = greedy(snapshots[1], GEN_PROMPTS, 12)
    with open(tasks / "tiny_gen.jsonl", "w", encoding="utf-8") as file:
        for prompt, text in zip(GEN_PROMPTS, answers, strict=True):
            file.write(json.dumps({"prompt": prompt, "answer": text.split(GEN_STOP)[0]}) + "\n")
    for name in ("tiny_gen.yaml", "tiny_mc.yaml"):
        (tasks / name).write_text((DATA / name).read_text().replace("DATA_DIR", str(tasks)))
    return LmEvalSetup(root / "base", snapshots, tasks)


def direct_hf(fn: LmEvalTasks, snapshot: Path) -> dict[str, Any]:
    """lm-eval's own ``hf`` model on ``snapshot``, with the settings ``fn`` uses."""
    import lm_eval

    results = lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": str(snapshot), "dtype": "float32"},
        tasks=list(fn.tasks),
        num_fewshot=fn.num_fewshot,
        limit=fn.limit,
        device="cpu",
        batch_size=1,
        task_manager=fn.load_tasks(),
        log_samples=True,
        random_seed=None,
        numpy_random_seed=None,
        torch_random_seed=None,
    )
    samples: dict[str, Any] = json.loads(json.dumps(results["samples"], default=repr))
    return {"metrics": fn_metrics(results), "samples": samples}


def fn_metrics(results: dict[str, Any]) -> dict[str, float]:
    from actorsys.evals.harnesses.lm_eval_tasks import output_of

    metrics = output_of(results, log_samples=False).metrics
    assert metrics is not None
    return metrics


def assert_same_samples(served: dict[str, Any], direct: dict[str, Any]) -> None:
    """Both harness paths saw the same documents and scored each alike: the same generated
    text, log-likelihoods within 1e-4 with the same greedy flags, the same per-sample metric."""
    for task in TASKS:
        ours, theirs = served[task], direct[task]
        assert [s["doc_id"] for s in ours] == [s["doc_id"] for s in theirs]
        assert ours
        for mine, reference in zip(ours, theirs, strict=True):
            assert mine["arguments"] == reference["arguments"]
            for metric in reference["metrics"]:
                assert mine[metric] == reference[metric], (task, mine["doc_id"], metric)
            if task == "tiny_gen":
                assert mine["filtered_resps"] == reference["filtered_resps"]
            else:
                for (value, is_greedy), (expected, expected_greedy) in zip(
                    mine["filtered_resps"], reference["filtered_resps"], strict=True
                ):
                    assert value == pytest.approx(expected, abs=1e-4)
                    assert is_greedy == expected_greedy


def config(tmp_path: Path, base: Path, **overrides: Any) -> EvalConfig:
    settings: dict[str, Any] = {
        "hf_dir": tmp_path / "staging",
        "base_checkpoint": base,
        "pin_timeout": 60.0,
        "eval_timeout": 120.0,
        "close_timeout": 10.0,
        **overrides,
    }
    return EvalConfig(**settings)


async def run_points(
    sup: EvalSupervisor, sink: MemorySink, snapshots: dict[int, Path]
) -> dict[int, Outcome]:
    for step, path in snapshots.items():
        await sup.submit(step, checkpoint_dir=str(path))
    report = await sup.drain(timeout=240)
    assert report.pending == []
    return sink.by_step()


@pytest.mark.slow
@pytest.mark.timeout(420)
async def test_scores_on_the_fleet_equal_lm_evals_own_hf_model_to_the_last_sample(
    setup: LmEvalSetup, tmp_path: Path
) -> None:
    fn = LmEvalTasks(TASKS, include_path=setup.tasks, num_concurrent=4, log_samples=True)
    sink = MemorySink()
    async with (
        LocalFleet.open([embedded(str(setup.base))] * 2) as local,
        EvalSupervisor.open(config(tmp_path, setup.base), eval_fn=fn, fleet=local.fleet, sink=sink) as sup,
    ):
        outcomes = await run_points(sup, sink, setup.snapshots)
    for step, snapshot in setup.snapshots.items():
        outcome = outcomes[step]
        assert outcome.status == "ok", (outcome.reason, outcome.data)
        direct = await trio.to_thread.run_sync(direct_hf, fn, snapshot)
        assert_same_samples(outcome.data["samples"], direct["samples"])
        assert outcome.metrics.keys() >= direct["metrics"].keys()
        for name, value in direct["metrics"].items():
            assert outcome.metrics[name] == pytest.approx(value, abs=1e-9), name
        assert outcome.data["lm_eval"]["n_samples"]["tiny_mc"]["effective"] == 12
    first, second = outcomes[1].metrics, outcomes[2].metrics
    assert first["eval/tiny_gen/exact_match"] == 1.0
    assert second["eval/tiny_gen/exact_match"] < 1.0
    assert first["eval/tiny_mc/acc"] != second["eval/tiny_mc/acc"]
    assert "eval/tiny_gen/exact_match/first-word" in first


@pytest.mark.slow
@pytest.mark.timeout(420)
async def test_a_served_point_is_scored_as_lm_evals_own_hf_model_scores_the_weights_loaded(
    setup: LmEvalSetup, tmp_path: Path
) -> None:
    fn = LmEvalTasks(TASKS, include_path=setup.tasks, num_concurrent=4, log_samples=True)
    settings = config(tmp_path, setup.base)
    async with LocalFleet.open([embedded(str(setup.base))]) as local:
        outcome = await evaluate_served(local.fleet.engines, setup.snapshots[1], 1, fn, settings)
    assert outcome.status == "ok", (outcome.reason, outcome.data)
    direct = await trio.to_thread.run_sync(direct_hf, fn, setup.snapshots[1])
    assert_same_samples(outcome.data["samples"], direct["samples"])
    assert outcome.metrics["eval/tiny_gen/exact_match"] == 1.0


class HangingRouter(httpx.AsyncBaseTransport):
    """A router in front of one engine that records every request it gets (when, and for
    which pinned version) and holds those of ``hang_version`` forever."""

    def __init__(self, engine_url: str, hang_version: str) -> None:
        self.hang_version = hang_version
        self.seen: list[tuple[float, str | None]] = []
        self.hung = trio.Event()
        self._forward = httpx.AsyncHTTPTransport()
        self.gate = RequestGate([engine_url], expected_version=None, transport=self)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        version = request.headers.get(VERSION_HEADER)
        self.seen.append((trio.current_time(), version))
        if version == self.hang_version:
            self.hung.set()
            await trio.sleep_forever()
        return await self._forward.handle_async_request(request)

    async def aclose(self) -> None:
        await self._forward.aclose()


class SettleTimes(MemorySink):
    def __init__(self) -> None:
        super().__init__()
        self.times: dict[int, float] = {}

    def record(self, outcome: Outcome) -> None:
        self.times[outcome.step] = trio.current_time()
        super().record(outcome)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_hung_request_is_cut_at_eval_timeout_and_the_abandoned_run_never_reaches_the_fleet(
    setup: LmEvalSetup, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="lm_eval")
    fn = LmEvalTasks(["tiny_mc"], include_path=setup.tasks, num_concurrent=2)
    await trio.to_thread.run_sync(fn.load_tasks)
    sink = SettleTimes()
    async with LocalFleet.open([embedded(str(setup.base))]) as local, trio.open_nursery() as nursery:
        router = HangingRouter(local.urls[0], hang_version="1")
        router_url = await nursery.start(router.gate.serve)
        fleet = Fleet([SGLangEngine(local.urls[0], api_key=local.api_key)], router_url=router_url)
        settings = config(tmp_path, setup.base, eval_timeout=6.0)
        async with EvalSupervisor.open(settings, eval_fn=fn, fleet=fleet, sink=sink) as sup:
            outcomes = await run_points(sup, sink, setup.snapshots)
            assert router.hung.is_set()
            with trio.fail_after(60):
                # The abandoned thread belongs to lm-eval: nothing signals its end but its exit.
                while fn.statistics()["threads"]:  # noqa: ASYNC110
                    await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
        await router.aclose()
    assert outcomes[1].status == "skipped" and outcomes[1].reason == "timeout"
    assert outcomes[2].status == "ok", (outcomes[2].reason, outcomes[2].data)
    assert "eval/tiny_mc/acc" in outcomes[2].metrics
    cut = sink.times[1]
    after_cut = [version for time, version in router.seen if time > cut and version is not None]
    assert after_cut and set(after_cut) == {"2"}
    # The abandoned run did try again after the cut: its retries found the gate closed.
    refused = [r for r in caplog.records if "Connect" in r.getMessage()]
    assert refused, [r.getMessage()[:200] for r in caplog.records]


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_fleet_that_fails_lm_evals_requests_skips_the_point_as_unhealthy(
    setup: LmEvalSetup,
) -> None:
    fn = LmEvalTasks(["tiny_mc"], include_path=setup.tasks, max_retries=1)
    fleet = Fleet([SGLangEngine(f"http://127.0.0.1:{free_port()}")])  # nothing listens there
    snapshot = str(setup.snapshots[1])
    with pytest.raises(EvalSkip) as raised:
        await fn.evaluate_checkpoint(snapshot, RolloutFnEvalInput(1, "1", snapshot, fleet))
    assert raised.value.reason == "unhealthy"
    assert "failed lm-eval's requests" in str(raised.value)

"""DatasetEval and ServerEvalFn against real embedded engine processes on loopback, with real
faults (a killed server, a restart in the middle of a pin, a reload by someone else).
Wall-clock bound: each test has a timeout."""

from __future__ import annotations

import logging
import math
import os
import signal
import statistics
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
import trio

from actorsys import EvalConfig, EvalSkip, EvalSupervisor, MemorySink, RolloutFnEvalInput
from actorsys.evals import DatasetEval, EvalDataset, ServerEvalFn
from actorsys.evals.scoring.metrics import pass_at_k, pass_ks
from actorsys.fleet import Fleet, SGLangEngine
from actorsys.fleet.local import LocalFleet, embedded, new_api_key
from tests.engine_process import engine_processes
from tests.evals.conftest import Answers, process_tree, running
from tests.fleet.conftest import TinyModels

# Two engine processes for the module: its tests share one worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("evals/test_real_engines")]


def config(tmp_path: Path, tiny: TinyModels) -> EvalConfig:
    return EvalConfig(hf_dir=tmp_path / "staging", base_checkpoint=tiny.base, pin_timeout=60.0,
                      eval_timeout=120.0, close_timeout=10.0)


def engine_argv(model: Path) -> list[str]:
    return [sys.executable, "-m", "actorsys", "engine", "--model", str(model), "--port", "{port}"]


def point(step: int, snapshot: Path) -> RolloutFnEvalInput:
    return RolloutFnEvalInput(rollout_id=step, hf_dir=str(snapshot))


def servers() -> set[int]:
    """This process's descendants that serve a model (engines, vLLM, sglang): not its scoring
    workers or the probe's reference worker, which an evaluation starts as it should."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            command = child.cmdline()
        except psutil.Error:
            continue
        if "engine" in command or any("api_server" in part or "sglang" in part for part in command):
            found.add(child.pid)
    return found


@dataclass(frozen=True)
class Engines:
    """Honest engines serving the base model, shared by the tests that need no fault of
    their own: each pins them to what it evaluates."""

    urls: list[str]
    key: str

    def fleet(self) -> Fleet:
        return Fleet([SGLangEngine(url, name=f"shared-{i}", api_key=self.key)
                      for i, url in enumerate(self.urls)])


@pytest.fixture(scope="module")
def engines(tiny: TinyModels) -> Iterator[Engines]:
    key = new_api_key()
    with engine_processes([["--model", str(tiny.base)]] * 2, key=key) as urls:
        yield Engines(urls, key)


class LogEvent(logging.Handler):
    """Sets ``event`` when actorsys logs a message containing ``text`` (e.g. a client that
    retries a request because the server is away)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.event = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()

    def __enter__(self) -> trio.Event:
        logger = logging.getLogger("actorsys")
        logger.addHandler(self)
        self.level_before = logger.level
        logger.setLevel(logging.INFO)
        return self.event

    def __exit__(self, *exc: object) -> None:
        logger = logging.getLogger("actorsys")
        logger.removeHandler(self)
        logger.setLevel(self.level_before)


def recomputed_stderrs(dataset: str, samples: list[dict]) -> dict[str, float]:
    """The standard errors of ``samples`` by hand: grouped by prompt, each prompt's mean score
    and pass@k estimate, then stdev(ddof=1) / sqrt(prompts)."""
    by_prompt: dict[str, list[float]] = {}
    for sample in samples:
        by_prompt.setdefault(sample["prompt"], []).append(sample["score"])
    groups = list(by_prompt.values())
    n = len(groups[0])
    errors = {f"eval/{dataset}/stderr": statistics.stdev([sum(g) / n for g in groups])}
    for k in pass_ks(n):
        estimates = [pass_at_k(n, sum(score == 1.0 for score in g), k) for g in groups]
        errors[f"eval/{dataset}/pass@{k}/stderr"] = statistics.stdev(estimates)
    return {metric: error / math.sqrt(len(groups)) for metric, error in errors.items()}


@pytest.mark.timeout(240)
async def test_dataset_eval_scores_each_snapshot_on_two_engines_and_pass_at_k_and_stderr_are_exact(
    tiny: TinyModels, answers: Answers, engines: Engines, tmp_path: Path
) -> None:
    greedy_set = answers.dataset(name="greedy")
    sampled = answers.dataset(name="sampled", n_samples=4, temperature=1.0)
    sink = MemorySink()
    evaluation = DatasetEval([greedy_set, sampled], concurrency=4, request_timeout=30.0)
    async with EvalSupervisor.open(config(tmp_path, tiny), eval_fn=evaluation,
                                   fleet=engines.fleet(), sink=sink) as sup:
        for step, snapshot in ((1, tiny.step1), (2, tiny.step2)):
            await sup.submit(step, checkpoint_dir=snapshot)
        assert (await sup.drain(timeout=180)).pending == []
    for step, name in ((1, "step1"), (2, "step2")):
        outcome = sink.by_step()[step]
        assert outcome.status == "ok", (outcome.reason, outcome.data)
        metrics = outcome.metrics
        assert metrics["eval/greedy"] == answers.expected[name]
        assert metrics["eval/greedy/pass@1"] == answers.expected[name]
        assert (metrics["eval/greedy/errors"], metrics["eval/greedy/samples"]) == (0.0, 4.0)
        assert metrics["eval/greedy/truncated_ratio"] == 1.0
        assert metrics["eval/greedy/response_len/mean"] == 6.0
        samples = outcome.data["samples"]["sampled"]
        assert len(samples) == 16
        correct = [sum(s["score"] == 1.0 for s in samples[i : i + 4]) for i in range(0, 16, 4)]
        for k in (1, 2, 4):
            hand = sum(pass_at_k(4, c, k) for c in correct) / 4
            assert metrics[f"eval/sampled/pass@{k}"] == pytest.approx(hand)
        assert metrics["eval/sampled"] == pytest.approx(sum(correct) / 16)
        for dataset in ("greedy", "sampled"):
            for metric, value in recomputed_stderrs(dataset, outcome.data["samples"][dataset]).items():
                assert metrics[metric] == value, metric


@pytest.mark.timeout(240)
async def test_attached_server_eval_pins_scores_survives_a_restart_mid_pin_and_never_launches(
    tiny: TinyModels, answers: Answers
) -> None:
    async with LocalFleet.open([embedded(str(tiny.base))]) as local:
        before = servers()
        assert before, "the fleet's own engine is found as a server"
        evaluation = ServerEvalFn(answers.dataset(), url=local.urls[0], api_key=local.api_key,
                                  request_timeout=30.0, pin_timeout=60.0)
        first = await evaluation.evaluate_checkpoint(str(tiny.step1), point(1, tiny.step1))
        assert first.metrics is not None
        assert first.metrics["eval/answers"] == answers.expected["step1"]

        pid = local.engines[0].process.command_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await local.engines[0].process.wait()
        # The evaluation starts while the engine is down and the fleet restarts it: its
        # requests wait in the backlog of the port the fleet holds until the engine is back.
        output = await evaluation.evaluate_checkpoint(str(tiny.step2), point(2, tiny.step2))
        assert local.engines[0].restarts == 1
        assert output.metrics is not None
        assert output.metrics["eval/answers"] == answers.expected["step2"]
        assert await local.fleet.engines[0].weight_version() == "2"

        assert evaluation.process is None
        after = servers()
        assert after - before <= {local.engines[0].process.pid,
                                  *(c.pid for c in psutil.Process(local.engines[0].process.pid)
                                    .children(recursive=True))}
        await evaluation.dispose()
        await local.fleet.engines[0].health()


@pytest.mark.timeout(240)
async def test_attached_server_that_labels_the_new_version_over_its_old_weights_is_a_pin_violation(
    tiny: TinyModels, answers: Answers
) -> None:
    liar = embedded(str(tiny.base), extra_args=("--test-keep-old-weights",
                                                "--test-label-kept-weights"))
    async with LocalFleet.open([liar]) as local:
        evaluation = ServerEvalFn(answers.dataset(), url=local.urls[0], api_key=local.api_key,
                                  request_timeout=30.0, pin_timeout=60.0)
        with pytest.raises(EvalSkip) as caught:
            await evaluation.evaluate_checkpoint(str(tiny.step1), point(1, tiny.step1))
        assert caught.value.reason == "pin_violation", caught.value
        assert "reads back version '1' but does not serve its weights" in str(caught.value)
        assert await local.fleet.engines[0].weight_version() == "1"
        unprobed = ServerEvalFn(answers.dataset(), url=local.urls[0], api_key=local.api_key,
                                request_timeout=30.0, probe=False)
        output = await unprobed.evaluate_checkpoint(str(tiny.step2), point(2, tiny.step2))
        assert output.metrics is not None
        assert output.metrics["eval/answers"] == answers.expected["base"]


@pytest.mark.timeout(240)
async def test_a_reload_by_someone_else_during_the_evaluation_is_a_pin_violation(
    tiny: TinyModels, engines: Engines
) -> None:
    url, key, other = engines.urls[0], engines.key, str(tiny.step2)

    def meddling(answer: str, label: object, record: dict) -> float:
        # Runs in a scoring worker process: it closes over plain strings only.
        body = {"model_path": other, "weight_version": "someone-else",
                "abort_all_requests": False}
        headers = {"Authorization": f"Bearer {key}"}  # a user who holds the key
        httpx.post(f"{url}/update_weights_from_disk", json=body, headers=headers,
                   timeout=60).raise_for_status()
        return 1.0

    records = ({"prompt": "one two three", "label": "x"},)
    dataset = EvalDataset(name="d", records=records, max_tokens=4, scorer=meddling)
    evaluation = ServerEvalFn(dataset, url=url, api_key=key, request_timeout=30.0)
    with pytest.raises(EvalSkip) as caught:
        await evaluation.evaluate_checkpoint(str(tiny.step1), point(1, tiny.step1))
    assert caught.value.reason == "pin_violation", caught.value
    assert "'someone-else'" in str(caught.value)


@pytest.mark.timeout(240)
async def test_launched_server_killed_between_points_skips_unhealthy_and_dispose_leaves_nothing(
    tiny: TinyModels, answers: Answers, tmp_path: Path
) -> None:
    evaluation = ServerEvalFn(answers.dataset(), launch=engine_argv(tiny.base),
                              ready_timeout=120.0, request_timeout=30.0, grace=2.0)
    assert evaluation.process is None
    sink = MemorySink()
    try:
        async with EvalSupervisor.open(config(tmp_path, tiny), eval_fn=evaluation,
                                       sink=sink) as sup:
            await sup.submit(1, checkpoint_dir=tiny.step1)
            await sup.drain(timeout=180)
            process = evaluation.process
            assert process is not None
            tree = process_tree(process.pid)
            pid = process.command_pid()
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            await process.wait()
            await sup.submit(2, checkpoint_dir=tiny.step2)
            await sup.drain(timeout=60)
    finally:
        await evaluation.dispose()
    first, second = sink.by_step()[1], sink.by_step()[2]
    assert first.status == "ok", (first.reason, first.data)
    assert first.metrics["eval/answers"] == answers.expected["step1"]
    assert (second.status, second.reason) == ("skipped", "unhealthy")
    assert running(tree) == []
    assert evaluation.process is None


@pytest.mark.timeout(120)
async def test_launched_server_is_stopped_by_dispose_also_when_cancelled(
    tiny: TinyModels, answers: Answers
) -> None:
    evaluation = ServerEvalFn(answers.dataset(), launch=engine_argv(tiny.base), grace=2.0)
    with LogEvent("launched the server") as launched, trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(evaluation.evaluate_checkpoint, str(tiny.step1),
                               point(1, tiny.step1))
            await launched.wait()
            scope.cancel()
    process = evaluation.process
    assert process is not None and process.returncode is None
    tree = process_tree(process.pid)
    log_path = evaluation.log_path
    with trio.CancelScope() as cancelled:
        cancelled.cancel()
        await evaluation.dispose()
    assert running(tree) == []
    assert log_path is not None and not os.path.exists(log_path)

"""InspectTasks on a real CPU engine (one engine process for the module): an inspect task with
a generate solver and a scorer yields its metrics, scored on the pinned snapshot's answers; a
task that raises skips the point with inspect's error in its data; nothing reaches past the
loopback."""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from actorsys import ConfigError, EvalConfig, EvalSupervisor, MemorySink, Outcome
from actorsys.evals import InspectTasks
from actorsys.fleet import SGLangEngine
from tests.chat_models import greedy_chat
from tests.evals.chat_engine import ChatEngine, chat_engine
from tests.fleet.pipeline import evaluate_served

# One engine process for the module: its tests share one worker.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.xdist_group("evals/test_inspect_tasks")]
# Imported while the module is collected: a first import deep in a test's stack, after other
# tests left garbage to collect, can hit CPython 3.11's "AST constructor recursion depth
# mismatch" in pydantic's docstring parsing (a finalizer running inside ast.parse).
pytest.importorskip("inspect_ai")

MAX_TOKENS = 6
QUESTIONS = ["what is 12 * 7?", "what is two plus two?"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChatEngine]:
    with chat_engine(tmp_path_factory.mktemp("inspect"), key=None, steps=(1,)) as engine:
        yield engine


class Connections:
    """Every address this process connects to or looks up while ``recording``."""

    def __init__(self) -> None:
        self.recording = False
        self.seen: list[Any] = []
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if self.recording and event in ("socket.connect", "socket.getaddrinfo"):
            self.seen.append(args[1] if event == "socket.connect" else args[0])

    def remote(self) -> list[Any]:
        """What was not this host."""
        found = []
        for item in self.seen:
            host = item[0] if isinstance(item, tuple) else item
            if isinstance(host, bytes):
                host = host.decode()
            if not isinstance(host, str) or host.startswith("/") or host == "localhost":
                continue
            try:
                if ipaddress.ip_address(host).is_loopback:
                    continue
            except ValueError:
                pass
            found.append(item)
        return found


CONNECTIONS = Connections()


def arithmetic(targets: list[str]) -> Any:
    from inspect_ai import Task
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import exact
    from inspect_ai.solver import generate

    pairs = enumerate(zip(QUESTIONS, targets, strict=True))
    samples = [Sample(input=question, target=target, id=i) for i, (question, target) in pairs]
    return Task(dataset=samples, solver=generate(), scorer=exact(), name="arith")


def failing() -> Any:
    from inspect_ai import Task
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import exact
    from inspect_ai.solver import Generate, TaskState, solver

    @solver
    def explode() -> Any:
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            raise RuntimeError("the environment blew up")

        return solve

    return Task(dataset=[Sample(input="hi", target="x")], solver=explode(), scorer=exact(), name="boom")


async def run(served: ChatEngine, tmp_path: Path, fn: InspectTasks) -> Outcome:
    config = EvalConfig(hf_dir=tmp_path / "staging", base_checkpoint=served.base, pin_timeout=60.0,
                        eval_timeout=120.0, close_timeout=10.0)
    sink = MemorySink()
    CONNECTIONS.recording = True
    try:
        async with EvalSupervisor.open(config, eval_fn=fn, fleet=served.fleet(), sink=sink) as sup:
            await sup.submit(1, checkpoint_dir=str(served.snapshots[1]))
            report = await sup.drain(timeout=120)
            assert report.pending == []
    finally:
        CONNECTIONS.recording = False
    return sink.by_step()[1]


async def test_a_task_on_a_served_point_is_scored_on_the_weights_the_trainer_loaded(
    served: ChatEngine, tmp_path: Path
) -> None:
    answer = await trio.to_thread.run_sync(
        greedy_chat, served.snapshots[1], [{"role": "user", "content": QUESTIONS[0]}], MAX_TOKENS
    )
    fn = InspectTasks(arithmetic([answer, "never this"]), generate_config={"max_tokens": MAX_TOKENS,
                                                                        "temperature": 0},
                      log_dir=tmp_path / "logs")
    config = EvalConfig(base_checkpoint=served.base, pin_timeout=60.0, eval_timeout=120.0,
                        close_timeout=10.0)
    engine = SGLangEngine(served.url, api_key=served.key)
    outcome = await evaluate_served([engine], served.snapshots[1], 1, fn, config)
    assert outcome.status == "ok", (outcome.reason, outcome.data)
    assert outcome.metrics["eval/arith/exact/mean"] == 0.5
    record = outcome.data["inspect"]["arith"]
    assert [s["output"] for s in record["samples"]][0] == answer


async def test_a_generate_and_score_task_yields_its_metrics_on_the_pinned_snapshot(
    served: ChatEngine, tmp_path: Path
) -> None:
    answer = await trio.to_thread.run_sync(
        greedy_chat, served.snapshots[1], [{"role": "user", "content": QUESTIONS[0]}], MAX_TOKENS
    )
    assert answer.strip()
    fn = InspectTasks(arithmetic([answer, "never this"]), generate_config={"max_tokens": MAX_TOKENS,
                                                                        "temperature": 0},
                      log_dir=tmp_path / "logs")
    outcome = await run(served, tmp_path, fn)
    assert outcome.status == "ok", (outcome.reason, outcome.data)
    assert outcome.metrics["eval/arith/exact/mean"] == 0.5
    assert "eval/arith/exact/stderr" in outcome.metrics
    # one right of two: the standard error of the mean of (1, 0) is 0.5
    stderr = outcome.metrics["eval/arith/exact/stderr"]
    assert outcome.metrics["eval/arith/exact/mean/stderr"] == stderr == 0.5
    record = outcome.data["inspect"]["arith"]
    assert record["status"] == "success"
    assert [s["output"] for s in record["samples"]][0] == answer
    assert [s["scores"]["exact"]["value"] for s in record["samples"]] == ["C", "I"]
    assert Path(record["log"]).is_file()
    assert CONNECTIONS.remote() == [], "inspect reached past the loopback"
    assert any(isinstance(item, tuple) for item in CONNECTIONS.seen), "the audit saw no connection"


async def test_a_task_that_raises_skips_the_point_with_the_error_in_its_data(
    served: ChatEngine, tmp_path: Path
) -> None:
    outcome = await run(served, tmp_path, InspectTasks(failing()))
    assert outcome.status == "skipped" and outcome.reason == "crashed"
    assert "the environment blew up" in outcome.data["error"]
    assert CONNECTIONS.remote() == []


def test_generate_config_is_checked_when_the_eval_fn_is_made() -> None:
    with pytest.raises(ConfigError, match="max_tokenz"):
        InspectTasks("arith", generate_config={"max_tokenz": 3})
    with pytest.raises(ConfigError, match="limit"):
        InspectTasks("arith", limit=0)
    assert socket.gethostname()

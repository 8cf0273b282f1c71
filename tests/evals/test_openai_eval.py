"""OpenAIEvalFn on a real CPU engine (one engine process for the module, under a key): a
two-turn conversation through the OpenAI SDK answered exactly as transformers answers the
pinned snapshot; the door closed after the evaluation; a client that never returns cut at
``eval_timeout``, its door closed behind it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from actorsys import (
    EvalConfig,
    EvalSupervisor,
    MemorySink,
    Outcome,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from actorsys.evals import OpenAIEvalFn
from actorsys.fleet import SGLangEngine, StaleWeightsError
from tests.chat_models import greedy_chat
from tests.evals.chat_engine import ChatEngine, chat_engine
from tests.fleet.pipeline import evaluate_served

# One engine process for the module: its tests share one worker.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.xdist_group("evals/test_openai_eval")]

MAX_TOKENS = 8
TURN_1 = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "what is 12 * 7?"}]
TURN_2 = {"role": "user", "content": "and two plus two?"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChatEngine]:
    """One real engine process for the module, under a key."""
    with chat_engine(tmp_path_factory.mktemp("openai_eval"), key="engine-key") as engine:
        yield engine


def greedy_turns(model_dir: Path) -> list[str]:
    """transformers' greedy answers to turn 1, then to turn 2 after its own answer."""
    first = greedy_chat(model_dir, TURN_1, MAX_TOKENS)
    second = greedy_chat(model_dir, [*TURN_1, {"role": "assistant", "content": first}, TURN_2], MAX_TOKENS)
    return [first, second]


class TwoTurns(OpenAIEvalFn):
    """One conversation of two turns; remembers the door it was given."""

    def __init__(self) -> None:
        self.doors: list[str] = []

    async def evaluate_with_client(
        self, client: Any, model: str, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        self.doors.append(str(client.base_url))
        messages: list[dict[str, Any]] = list(TURN_1)
        answers = []
        for turn in range(2):
            if turn:
                messages += [{"role": "assistant", "content": answers[-1]}, TURN_2]
            reply = await client.chat.completions.create(
                model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0
            )
            answers.append(reply.choices[0].message.content)
        return RolloutFnEvalOutput(
            data={"answers": answers, "model": model},
            metrics={"eval/turns": float(len(answers))},
        )


class NeverReturns(OpenAIEvalFn):
    """Asks once, then never returns, even when cancelled (at step 1 only); closed one second
    after its cut."""

    shutdown_grace = 1.0

    def __init__(self) -> None:
        self.doors: list[str] = []

    async def evaluate_with_client(
        self, client: Any, model: str, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        self.doors.append(str(client.base_url))
        await client.chat.completions.create(model=model, messages=TURN_1, max_tokens=2)
        while input.rollout_id == 1:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue
        return RolloutFnEvalOutput(metrics={"eval/done": 1.0})


def settings(tmp_path: Path, base: Path, **overrides: Any) -> EvalConfig:
    values: dict[str, Any] = {
        "hf_dir": tmp_path / "staging",
        "base_checkpoint": base,
        "pin_timeout": 60.0,
        "eval_timeout": 60.0,
        "close_timeout": 10.0,
        **overrides,
    }
    return EvalConfig(**values)


async def evaluate(
    served: ChatEngine, tmp_path: Path, fn: OpenAIEvalFn, steps: list[int], **overrides: Any
) -> dict[int, Outcome]:
    sink = MemorySink()
    config = settings(tmp_path, served.base, **overrides)
    async with EvalSupervisor.open(config, eval_fn=fn, fleet=served.fleet(), sink=sink) as sup:
        for step in steps:
            await sup.submit(step, checkpoint_dir=str(served.snapshots[step]))
        report = await sup.drain(timeout=120)
        assert report.pending == []
    return sink.by_step()


async def refused(url: str, key: str | None) -> bool:
    """Whether a chat request to ``url`` (a door) fails to reach any engine."""
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            response = await client.post(
                f"{url.rstrip('/')}/chat/completions",
                json={"messages": TURN_1, "max_tokens": 1},
                headers={"Authorization": f"Bearer {key}"} if key else {},
            )
    except httpx.ConnectError:
        return True
    return response.status_code == 404


async def test_two_turns_through_the_door_equal_transformers_on_the_pinned_snapshot_under_the_key(
    served: ChatEngine, tmp_path: Path
) -> None:
    fn = TwoTurns()
    outcomes = await evaluate(served, tmp_path, fn, [1, 2])
    for step in (1, 2):
        outcome = outcomes[step]
        assert outcome.status == "ok", (outcome.reason, outcome.data)
        expected = await trio.to_thread.run_sync(greedy_turns, served.snapshots[step])
        assert outcome.data["answers"] == expected
        assert outcome.metrics["eval/turns"] == 2.0
        assert outcome.data["model"] == str(served.base)
    assert outcomes[1].data["answers"] != outcomes[2].data["answers"]
    assert len(set(fn.doors)) == 2
    assert all(door.startswith("http://127.0.0.1:") for door in fn.doors)
    for door in fn.doors:
        assert await refused(door, served.key)
    assert fn.statistics() == {"loops": 0}
    async with httpx.AsyncClient() as client:
        direct = await client.post(f"{served.url}/v1/chat/completions", json={"messages": TURN_1},
                                   headers={"Authorization": "Bearer actorsys-door"})
    assert direct.status_code == 401, "the client's own key must not open the engine"


async def test_two_turns_on_a_served_point_equal_transformers_on_the_weights_the_trainer_loaded(
    served: ChatEngine, tmp_path: Path
) -> None:
    engine = SGLangEngine(served.url, api_key=served.key)
    outcome = await evaluate_served(
        [engine], served.snapshots[2], 2, TwoTurns(), settings(tmp_path, served.base)
    )
    assert outcome.status == "ok", (outcome.reason, outcome.data)
    expected = await trio.to_thread.run_sync(greedy_turns, served.snapshots[2])
    assert outcome.data["answers"] == expected


async def test_a_client_that_never_returns_is_cut_at_eval_timeout_and_its_door_is_closed(
    served: ChatEngine, tmp_path: Path
) -> None:
    fn = NeverReturns()
    started = trio.current_time()
    outcomes = await evaluate(served, tmp_path, fn, [1, 2], eval_timeout=5.0)
    assert outcomes[1].status == "skipped" and outcomes[1].reason == "timeout"
    assert outcomes[2].status == "ok", (outcomes[2].reason, outcomes[2].data)
    assert trio.current_time() - started < 60
    assert len(fn.doors) == 2
    assert await refused(fn.doors[0], served.key)
    with trio.fail_after(10):
        while fn.statistics()["loops"]:  # noqa: ASYNC110 - a thread's end signals nothing else
            await trio.sleep(0.05)


class Retries(OpenAIEvalFn):
    """Keeps asking while the door answers errors (the first stale answer ends the
    evaluation, before or after the client sees the door's 502)."""

    max_retries = 0

    def __init__(self) -> None:
        self.errors: list[str] = []

    async def evaluate_with_client(
        self, client: Any, model: str, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        import openai

        while True:
            try:
                await client.chat.completions.create(model=model, messages=TURN_1, max_tokens=1)
            except openai.APIError as exc:
                self.errors.append(type(exc).__name__)
            await asyncio.sleep(0.01)


async def test_a_chat_answer_from_other_weights_than_the_pinned_ones_is_a_pin_violation(
    served: ChatEngine,
) -> None:
    fleet = served.fleet()
    fleet.version = "7"  # what a pin would have set; the engine serves another version
    fn = Retries()
    with trio.fail_after(60), pytest.raises(StaleWeightsError) as raised:
        await fn.evaluate_checkpoint(str(served.base), RolloutFnEvalInput(7, "7", str(served.base), fleet))
    assert raised.value.reason == "pin_violation"
    assert raised.value.expected == "7" and raised.value.actual != "7"

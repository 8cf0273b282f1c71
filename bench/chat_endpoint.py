"""The chat endpoint's cost, and the door's, on one CPU engine, in one run.

Run: ``.venv/bin/python bench/chat_endpoint.py [--prompts 64 --concurrency 8 --rounds 3]``

1. ``/v1/chat/completions`` against ``/v1/completions`` on the same prompts: each conversation
   (a system message, a question, the calculator tool) is sent as ``messages`` to the chat
   endpoint, and as the very token ids the template renders to the completions endpoint;
   greedy, ``--max-tokens`` each, ``--concurrency`` in flight. What the chat route adds is the
   template's rendering and the answer's tool-call parsing. Prints prompts/s of each and the
   ratio chat / completions.
2. ``OpenAIEvalFn``'s requests/s against the same client talking to the engine directly (the
   door's cost): the same coroutine sends ``--requests`` chat requests through an
   OpenAIEvalFn's door, and through an ``openai.AsyncOpenAI`` pointed at the engine, on an
   asyncio loop in a thread either way; once for each of ``--door-max-tokens`` (default 2
   and 16 tokens an answer: the door's cost is per request, so the shortest answers show it
   most). Prints requests/s of each and the ratio direct / door (the goal: at most 1.1).

Rounds alternate the two sides (the machine's load drifts): the rates are the medians over the
rounds, each ratio the median of the rounds' own ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from actorsys import RolloutFnEvalInput, RolloutFnEvalOutput  # noqa: E402
from actorsys.evals import OpenAIEvalFn  # noqa: E402
from actorsys.fleet.chat_template import load_tokenizer, render_chat  # noqa: E402
from actorsys.fleet.local import LocalFleet, embedded  # noqa: E402
from tests.chat_models import CALCULATOR, make_tool_chat_model  # noqa: E402

QUESTIONS = ["what is {a} * {b}?", "add {a} and {b}", "is {a} larger than {b}?", "{a} minus {b} is?"]


def conversations(count: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "system", "content": "Use the calculator."},
         {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)].format(a=i * 7 % 97, b=i)}]
        for i in range(count)
    ]


async def prompts_per_second(
    url: str, key: str, bodies: list[dict[str, Any]], path: str, concurrency: int
) -> float:
    limiter = trio.CapacityLimiter(concurrency)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, timeout=300.0, headers=headers) as client:

        async def one(body: dict[str, Any]) -> None:
            async with limiter:
                response = await client.post(path, json=body)
                response.raise_for_status()

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for body in bodies:
                nursery.start_soon(one, body)
        return len(bodies) / (time.perf_counter() - started)


async def burst(client: Any, model: str, requests: int, concurrency: int, max_tokens: int) -> float:
    """``requests`` chat requests, ``concurrency`` at a time; requests/s."""
    semaphore = asyncio.Semaphore(concurrency)
    messages = conversations(1)[0]

    async def one() -> None:
        async with semaphore:
            await client.chat.completions.create(model=model, messages=messages, tools=[CALCULATOR],
                                                 temperature=0, max_tokens=max_tokens)

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(requests)))
    return requests / (time.perf_counter() - started)


class Burst(OpenAIEvalFn):
    def __init__(self, requests: int, concurrency: int, max_tokens: int) -> None:
        self.settings = (requests, concurrency, max_tokens)

    async def evaluate_with_client(
        self, client: Any, model: str, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        rate = await burst(client, model, *self.settings)
        return RolloutFnEvalOutput(metrics={"eval/requests_per_second": rate})


def direct(url: str, key: str, model: str, settings: tuple[int, int, int]) -> float:
    import openai

    async def main() -> float:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as client:
            return await burst(client, model, *settings)

    return asyncio.run(main())


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as root:
        model_dir = await trio.to_thread.run_sync(make_tool_chat_model, Path(root) / "chat")
        tokenizer = await trio.to_thread.run_sync(load_tokenizer, str(model_dir))
        chats = conversations(args.prompts)
        rendered = [render_chat(tokenizer, c, tools=[CALCULATOR]) for c in chats]
        common = {"temperature": 0, "max_tokens": args.max_tokens}
        chat_bodies = [{"messages": c, "tools": [CALCULATOR], **common} for c in chats]
        completion_bodies = [{"prompt": list(r.token_ids), **common} for r in rendered]
        async with LocalFleet.open([embedded(str(model_dir))]) as local:
            url, key = local.urls[0], local.api_key
            await prompts_per_second(url, key, completion_bodies[:4], "/v1/completions", 4)  # warm-up
            rates: dict[str, list[float]] = {"chat": [], "completions": []}
            for _ in range(args.rounds):
                rates["chat"].append(await prompts_per_second(
                    url, key, chat_bodies, "/v1/chat/completions", args.concurrency))
                rates["completions"].append(await prompts_per_second(
                    url, key, completion_bodies, "/v1/completions", args.concurrency))
                for tokens in args.door_max_tokens:
                    settings = (args.requests, args.concurrency, tokens)
                    point = RolloutFnEvalInput(1, fleet=local.fleet)
                    output = await Burst(*settings).evaluate_checkpoint(str(model_dir), point)
                    assert output.metrics is not None
                    rates.setdefault(f"door{tokens}", []).append(output.metrics["eval/requests_per_second"])
                    rates.setdefault(f"direct{tokens}", []).append(await trio.to_thread.run_sync(
                        direct, url, key, str(model_dir), settings))
    median = {name: statistics.median(values) for name, values in rates.items()}

    def ratio(top: str, bottom: str) -> float:
        return statistics.median(a / b for a, b in zip(rates[top], rates[bottom], strict=True))

    print(f"{args.prompts} prompts, {args.max_tokens} tokens each, {args.concurrency} in flight, "
          f"{args.rounds} rounds (medians)")
    print(f"  /v1/chat/completions  {median['chat']:8.2f} prompts/s")
    print(f"  /v1/completions       {median['completions']:8.2f} prompts/s")
    print(f"  chat / completions    {ratio('chat', 'completions'):8.3f}")
    for tokens in args.door_max_tokens:
        door, straight = median[f"door{tokens}"], median[f"direct{tokens}"]
        print(f"{args.requests} chat requests, {tokens} tokens each, {args.concurrency} in flight")
        print(f"  OpenAIEvalFn (door)   {door:8.2f} requests/s")
        print(f"  same client, direct   {straight:8.2f} requests/s")
        print(f"  direct / door         {ratio(f'direct{tokens}', f'door{tokens}'):8.3f}   (goal <= 1.1)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--door-max-tokens", type=int, nargs="+", default=[2, 16])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    trio.run(main, parser.parse_args())

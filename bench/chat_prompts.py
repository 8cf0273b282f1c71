"""What the chat path costs per prompt against a plain prompt, in one run.

Run: ``.venv/bin/python bench/chat_prompts.py [--prompts 256 --repeats 3]``

The same questions, as two datasets of the tiny chat model (a Qwen3-style template with a
system message and tools, ``enable_thinking`` off):

- ``plain``: the question as a plain prompt, sent as text (the engine tokenizes it);
- ``text``: the conversation as the template renders it, given as a plain prompt (the same
  length as ``chat``, rendered once beforehand, sent as text);
- ``chat``: the question as chat messages with ``apply_chat_template``: rendered by the
  snapshot's template at every point and sent as token ids.

Measured, alternating ``--repeats`` times (medians):

1. preparing the prompts for one point (:func:`actorsys.evals.data.prompts.prepare_prompts`: the
   tokenizer load, then for ``chat`` rendering and tokenizing every prompt, for ``plain``
   tokenizing them to fit the context);
2. a whole evaluation on one real CPU engine (``evaluate_datasets``, ``max_tokens=1`` so that
   generation does not hide the prompt's cost), prompts being much longer as chat.

Prints milliseconds per prompt, ``chat / plain`` and ``chat / text`` (the cost of rendering
and sending ids against a prompt of the same length sent as text).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actorsys.evals import EvalDataset  # noqa: E402
from actorsys.evals.data.prompts import prepare_prompts  # noqa: E402
from actorsys.evals.harnesses.sampling import evaluate_datasets  # noqa: E402
from actorsys.fleet.chat_template import load_tokenizer, render_chat  # noqa: E402
from actorsys.fleet.local import LocalFleet, embedded  # noqa: E402
from tests.chat_models import ADD_TOOL, make_chat_model  # noqa: E402

WORDS = "the quick brown fox jumps over the lazy dog what is two plus two".split()


def questions(count: int) -> list[str]:
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(6 + i % 5)) for i in range(count)]


def datasets(directory: Path, model: Path, count: int) -> dict[str, EvalDataset]:
    tokenizer = load_tokenizer(str(model))
    records = []
    for q in questions(count):
        messages = [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": q}]
        rendered = render_chat(tokenizer, messages, tools=[ADD_TOOL],
                               chat_template_kwargs={"enable_thinking": False})
        records.append({"question": q, "label": "four", "tools": [ADD_TOOL],
                        "messages": messages, "rendered": rendered.text})
    path = directory / "questions.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    common: dict[str, Any] = {"max_tokens": 1, "scorer": "exact"}
    return {
        "plain": EvalDataset.from_jsonl(path, name="plain", input_key="question", **common),
        "text": EvalDataset.from_jsonl(path, name="text", input_key="rendered", **common),
        "chat": EvalDataset.from_jsonl(path, name="chat", input_key="messages", tool_key="tools",
                                       apply_chat_template=True,
                                       chat_template_kwargs={"enable_thinking": False}, **common),
    }


def timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = await trio.to_thread.run_sync(lambda: make_chat_model(root / "model", seed=1))
        sets = datasets(root, model, args.prompts)
        lengths = {}
        for name, dataset in sets.items():
            [prepared] = prepare_prompts(str(model), [dataset])
            fits = prepared.fits or []
            lengths[name] = statistics.mean(f.prompt_tokens for f in fits)
        prepare: dict[str, list[float]] = {name: [] for name in sets}
        evaluate: dict[str, list[float]] = {name: [] for name in sets}
        async with LocalFleet.open([embedded(str(model))], startup_timeout=300) as local:
            for _ in range(args.repeats):
                for name, dataset in sets.items():
                    prepare[name].append(timed(lambda d=dataset: prepare_prompts(str(model), [d])))
                    started = time.perf_counter()
                    output = await evaluate_datasets(local.fleet, [dataset], concurrency=8,
                                                     request_timeout=120.0, retries=0,
                                                     checkpoint_dir=str(model))
                    evaluate[name].append(time.perf_counter() - started)
                    assert (output.metrics or {})[f"eval/{name}/errors"] == 0.0
    count = args.prompts
    print(f"{count} prompts, {args.repeats} repeats, one CPU engine, max_tokens=1 (mean prompt "
          f"tokens: plain {lengths['plain']:.0f}, text {lengths['text']:.0f}, "
          f"chat {lengths['chat']:.0f})")
    print(f"{'ms per prompt':24}{'plain':>9}{'text':>9}{'chat':>9}{'chat/plain':>12}"
          f"{'chat/text':>11}")
    for label, runs in (("prepare (render + fit)", prepare), ("evaluate (end to end)", evaluate)):
        plain, text, chat = (statistics.median(runs[n]) * 1000 / count
                             for n in ("plain", "text", "chat"))
        print(f"{label:24}{plain:9.3f}{text:9.3f}{chat:9.3f}{chat / plain:12.2f}"
              f"{chat / text:11.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    trio.run(main, parser.parse_args())

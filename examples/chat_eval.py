"""A chat model evaluated as miles users evaluate theirs: chat messages rendered by the
snapshot's own Qwen3-style template (thinking on, and off through ``enable_thinking``),
graded ``deepscaler``, in a training loop and then by ``actorsys watch`` from one eval config.

    python examples/chat_eval.py --steps 60 --eval-every 30

The model is a tiny stand-in for a Qwen3 checkpoint, made locally (its template begins with
the BOS, and its tokenizer adds one to plain text, as Llama-3's does). It learns to answer
``<think>...</think>\\n\\n\\boxed{N}`` with thinking on and ``\\boxed{N}`` with thinking off.
With thinking on, ``deepscaler`` grades only what follows ``</think>``; with thinking off the
template puts the empty thinking block in the prompt, the answer holds no ``</think>`` (miles'
``deepscaler`` would score it 0), so that set is graded ``boxed_math``. The eval settings are
written once, in ``eval.yaml``: the trainer reads them with ``load_eval_config``, ``watch``
with ``--eval-config``, and both report the same scores for the same weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actorsys import EvalConfig, MemorySink  # noqa: E402
from actorsys.evals import ServerEvalFn, load_eval_config  # noqa: E402
from actorsys.fleet.chat_template import load_tokenizer, render_chat  # noqa: E402
from bridge import EvalBridge  # noqa: E402
from tests.chat_models import make_chat_model  # noqa: E402

QUESTIONS = [("what is 1 plus 3?", 4), ("what is 2 plus 5?", 7), ("what is 3 plus 3?", 6)]
SYSTEM = "You are a helpful assistant. Put the final answer in \\boxed{}."
THOUGHT = "<think>\nadd the two numbers\n</think>\n\n"
EVAL_YAML = """\
defaults:
  input_key: messages
  apply_chat_template: true
  max_tokens: 48
datasets:
  - name: think                # thinking on: graded after </think>
    path: chat.jsonl
    rm_type: deepscaler
  - name: direct               # thinking off: the empty block is in the prompt
    path: chat.jsonl
    apply_chat_template_kwargs: {enable_thinking: false}
    rm_type: boxed_math
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=30, metavar="K")
    parser.add_argument("--workdir", help="where the model, data, checkpoints and results go")
    parser.add_argument("--results", help="write the trainer's and watch's scores here (JSON)")
    return parser.parse_args(argv)


def write_data(workdir: Path) -> Path:
    records = [{"messages": [{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": question}],
                "label": str(answer)} for question, answer in QUESTIONS]
    (workdir / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    config = workdir / "eval.yaml"
    config.write_text(EVAL_YAML)
    return config


def training_pairs(base: Path) -> list[tuple[torch.Tensor, int]]:
    """Each question rendered by the template (thinking on and off) followed by its answer:
    the token ids, and where the answer starts."""
    tokenizer = load_tokenizer(str(base))
    pairs = []
    for question, answer in QUESTIONS:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        for kwargs, target in (({}, f"{THOUGHT}\\boxed{{{answer}}}"),
                               ({"enable_thinking": False}, f"\\boxed{{{answer}}}")):
            prompt = render_chat(tokenizer, messages, chat_template_kwargs=kwargs).token_ids
            answer_ids = tokenizer(target, add_special_tokens=False)["input_ids"]
            ids = [*prompt, *answer_ids, tokenizer.eos_token_id]
            pairs.append((torch.tensor([ids]), len(prompt)))
    return pairs


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               pairs: list[tuple[torch.Tensor, int]]) -> float:
    model.train()
    optimizer.zero_grad()
    total = 0.0
    for ids, start in pairs:
        labels = ids.clone()
        labels[:, :start] = -100
        loss = model(input_ids=ids, labels=labels).loss / len(pairs)
        loss.backward()
        total += loss.item()
    optimizer.step()
    return total


def save_checkpoint(model: transformers.PreTrainedModel, base: Path, directory: Path) -> None:
    """What a trainer saves anyway (here for ``watch``): weights, config, tokenizer, marker."""
    model.save_pretrained(directory)
    load_tokenizer(str(base)).save_pretrained(directory)
    (directory / ".complete").write_bytes(b"")


def scores(outcomes: list[dict]) -> dict[int, dict[str, float]]:
    return {o["step"]: {name: o["metrics"][f"eval/{name}"] for name in ("think", "direct")}
            for o in outcomes if o["status"] == "ok"}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    transformers.utils.logging.disable_progress_bar()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="actorsys-chat-"))
    workdir.mkdir(parents=True, exist_ok=True)
    base = make_chat_model(workdir / "base", seed=0)
    eval_yaml = write_data(workdir)
    datasets = load_eval_config(eval_yaml)

    model = transformers.AutoModelForCausalLM.from_pretrained(base)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    pairs = training_pairs(base)
    engine = [sys.executable, "-m", "actorsys", "engine", "--model", str(base), "--port", "{port}"]
    config = EvalConfig(hf_dir=workdir / "staging", base_checkpoint=base, eval_timeout=300.0)
    sink = MemorySink()
    with EvalBridge(config, eval_fn=ServerEvalFn(datasets, launch=engine), sink=sink) as ev:
        ev.submit(0, model=model)  # before training: it answers nothing right
        save_checkpoint(model, base, workdir / "ckpt" / "step_0")
        for step in range(1, args.steps + 1):
            loss = train_step(model, optimizer, pairs)
            if step % args.eval_every == 0:
                ev.submit(step, model=model)
                save_checkpoint(model, base, workdir / "ckpt" / f"step_{step}")
                print(f"step {step:>4}: train loss {loss:.3f}, eval point submitted", flush=True)
        ev.drain(timeout=300)
        report = ev.close()
    trainer = scores([dataclasses.asdict(o) for o in sink.outcomes])

    out = workdir / "watch"
    watch = subprocess.run(
        [sys.executable, "-m", "actorsys", "watch", str(workdir / "ckpt"), "--eval-config",
         str(eval_yaml), "--engines", "1", "--once", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    if watch.returncode != 0:
        print(watch.stderr, file=sys.stderr)
        return 1
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    watched = scores(lines)

    print(f"{'step':>6}{'think (trainer)':>17}{'think (watch)':>15}{'direct (trainer)':>18}"
          f"{'direct (watch)':>16}")
    for step in sorted(trainer):
        print(f"{step:>6}{trainer[step]['think']:>17.2f}{watched[step]['think']:>15.2f}"
              f"{trainer[step]['direct']:>18.2f}{watched[step]['direct']:>16.2f}")
    sample = sink.outcomes[-1].data["samples"]["think"][0]
    print(f"a prompt as the model saw it: {sample['prompt']!r}\nits answer: {sample['answer']!r}")
    if args.results:
        Path(args.results).write_text(json.dumps(
            {"trainer": trainer, "watch": watched, "close_clean": report.clean,
             "prompt": sample["prompt"]}, default=repr))
    return 0 if report.clean and trainer == watched else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())

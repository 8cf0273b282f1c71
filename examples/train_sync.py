"""A plain torch training loop that evaluates every K steps without waiting for the result.

    python examples/train_sync.py --steps 40 --eval-every 10 --eval-overflow-policy skip

Each evaluation point costs the loop one copy of the weights; the snapshot is written,
loaded back with transformers and scored in the background (see ``tiny_lm.PerplexityEval``),
and the score is recorded at the step the weights came from. The evaluation flags are
EvalConfig's (``--eval-hf-dir``, ``--eval-max-in-flight``, ``--eval-timeout``...).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import tiny_lm
import torch
import transformers

from actorsys import EvalConfig
from bridge import EvalBridge


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=10, metavar="K")
    parser.add_argument("--workdir", help="where the base checkpoint and snapshots go")
    parser.add_argument("--results", help="write the outcomes and the close report here (JSON)")
    EvalConfig.add_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    transformers.utils.logging.disable_progress_bar()
    tokenizer, model_config, config = tiny_lm.set_up(args)

    model = tiny_lm.new_model(model_config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    inputs = tiny_lm.batch(tokenizer, tiny_lm.TRAIN_TEXTS)
    sink = tiny_lm.PrintSink()
    with EvalBridge(config, eval_fn=tiny_lm.PerplexityEval(), sink=sink) as evaluation:
        for step in range(1, args.steps + 1):
            loss = tiny_lm.train_step(model, optimizer, inputs)
            evaluation.note_step(step)
            if step % args.eval_every == 0:
                admitted = evaluation.submit(step, model=model)
                print(f"step {step:>4}: train loss {loss:.3f}, eval point "
                      f"{'submitted' if admitted else 'not admitted'}", flush=True)
        drained = evaluation.drain(timeout=120)
        report = evaluation.close()
    print(f"done: {sink.summary()}; still pending after drain: {drained.pending}; "
          f"close clean: {report.clean}")
    if args.results:
        with open(args.results, "w", encoding="utf-8") as f:
            json.dump({"outcomes": [dataclasses.asdict(o) for o in sink.outcomes],
                       "close": dataclasses.asdict(report)}, f, default=repr)
    return 0 if report.clean else 1


if __name__ == "__main__":
    sys.exit(main())

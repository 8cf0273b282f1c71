"""A transformers ``Trainer`` that evaluates every K optimizer steps without waiting.

    python examples/train_hf_trainer.py --steps 30 --eval-every 10

``EvalCallback`` submits the model at the end of every K-th step (one copy of the weights),
the snapshot is scored in the background (``tiny_lm.PerplexityEval``), and each score lands
in ``trainer.state.log_history`` as a row of its own with ``eval/step``, and in every
``report_to`` integration, before ``train()`` returns. The evaluation flags are EvalConfig's.
"""

from __future__ import annotations

import sys

import tiny_lm
import transformers
from transformers import Trainer, TrainingArguments

from actorsys.integrations.transformers import EvalCallback


def main(argv: list[str] | None = None) -> int:
    args = tiny_lm.parse_training_args(__doc__.split("\n")[0], argv, steps=30, every=10)
    transformers.utils.logging.disable_progress_bar()
    tokenizer, model_config, config = tiny_lm.set_up(args)
    rows = [{k: v[0].tolist() for k, v in tiny_lm.batch(tokenizer, [text]).items()}
            for text in tiny_lm.TRAIN_TEXTS]
    width = max(len(row["input_ids"]) for row in rows)
    for row in rows:  # one length, so the default collator stacks them
        pad = width - len(row["input_ids"])
        row["input_ids"] += [tokenizer.pad_token_id] * pad
        row["attention_mask"] += [0] * pad
        row["labels"] += [-100] * pad

    sink = tiny_lm.PrintSink()
    callback = EvalCallback(config, eval_fn=tiny_lm.PerplexityEval(), every=args.eval_every,
                            sink=sink, drain_timeout=120)
    trainer = Trainer(
        model=tiny_lm.new_model(model_config), train_dataset=rows * 8, callbacks=[callback],
        args=TrainingArguments(
            output_dir=f"{config.staging_dir}-trainer", max_steps=args.steps,
            per_device_train_batch_size=4, learning_rate=3e-3, logging_steps=10,
            save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
        ),
    )
    trainer.train()
    eval_rows = [row for row in trainer.state.log_history if "eval/step" in row]
    print(f"done: {sink.summary()}; eval rows in log_history: "
          f"{[int(row['eval/step']) for row in eval_rows]}")
    tiny_lm.write_results(args.results, sink.outcomes, eval_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

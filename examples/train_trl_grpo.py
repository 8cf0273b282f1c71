"""TRL's ``GRPOTrainer`` evaluating every K optimizer steps without waiting (CPU,
generation through transformers: ``use_vllm=False``).

    python examples/train_trl_grpo.py --steps 6 --eval-every 3

The policy is rewarded for completions made of words of the training texts; at every K-th
step ``EvalCallback`` hands its weights over, and the snapshot's perplexity on held-out text
(``tiny_lm.PerplexityEval``) lands in ``trainer.state.log_history`` with ``eval/step``.
The same callback serves ``SFTTrainer``, ``DPOTrainer`` and every other TRL trainer.
"""

from __future__ import annotations

import sys
from typing import Any

import tiny_lm
import transformers
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from actorsys.integrations.transformers import EvalCallback

KNOWN_WORDS = {word for text in tiny_lm.TRAIN_TEXTS for word in text.split()}


def known_words(completions: list[str], **kwargs: Any) -> list[float]:
    """The share of a completion's words that the training texts use."""
    scores = []
    for text in completions:
        words = text.split()
        scores.append(sum(word in KNOWN_WORDS for word in words) / max(len(words), 1))
    return scores


def main(argv: list[str] | None = None) -> int:
    args = tiny_lm.parse_training_args(__doc__.split("\n")[0], argv, steps=6, every=3)
    transformers.utils.logging.disable_progress_bar()
    tokenizer, model_config, config = tiny_lm.set_up(args)
    prompts = Dataset.from_list(
        [{"prompt": " ".join(text.split()[:3])} for text in tiny_lm.TRAIN_TEXTS] * 4)

    sink = tiny_lm.PrintSink()
    trainer = GRPOTrainer(
        model=tiny_lm.new_model(model_config), processing_class=tokenizer,
        reward_funcs=known_words, train_dataset=prompts,
        callbacks=[EvalCallback(config, eval_fn=tiny_lm.PerplexityEval(), every=args.eval_every,
                                sink=sink, drain_timeout=120)],
        args=GRPOConfig(
            output_dir=f"{config.staging_dir}-trainer", max_steps=args.steps, use_vllm=False,
            per_device_train_batch_size=4, num_generations=2, max_completion_length=8,
            learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none",
            use_cpu=True, disable_tqdm=True,
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

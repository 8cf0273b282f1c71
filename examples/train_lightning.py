"""A Lightning run that evaluates every K optimizer steps without waiting.

    python examples/train_lightning.py --steps 30 --eval-every 10

The LightningModule holds a transformers model in ``self.model``; ``EvalCallback`` exports
that model (its keys are the Hugging Face model's, so any engine loads the snapshot), scores
it in the background (``tiny_lm.PerplexityEval``) and logs the score to every logger of the
trainer at the step the weights came from (here a CSV file under the workdir).
"""

from __future__ import annotations

import csv
import os
import sys

import lightning.pytorch as pl
import tiny_lm
import torch
import transformers
from lightning.pytorch.loggers import CSVLogger

from actorsys.integrations.lightning import EvalCallback


class TinyLM(pl.LightningModule):
    def __init__(self, model: transformers.PreTrainedModel) -> None:
        super().__init__()
        self.model = model

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.model(**batch).loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def main(argv: list[str] | None = None) -> int:
    args = tiny_lm.parse_training_args(__doc__.split("\n")[0], argv, steps=30, every=10)
    transformers.utils.logging.disable_progress_bar()
    tokenizer, model_config, config = tiny_lm.set_up(args)
    inputs = tiny_lm.batch(tokenizer, tiny_lm.TRAIN_TEXTS)
    rows = [{k: v[i] for k, v in inputs.items()} for i in range(len(tiny_lm.TRAIN_TEXTS))]
    loader = torch.utils.data.DataLoader(rows * 8, batch_size=4)  # type: ignore[arg-type]

    sink = tiny_lm.PrintSink()
    logger = CSVLogger(os.path.join(os.path.dirname(config.staging_dir or "."), "logs"))
    trainer = pl.Trainer(
        max_steps=args.steps, accelerator="cpu", devices=1, logger=logger,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[EvalCallback(config, eval_fn=tiny_lm.PerplexityEval(),
                                every=args.eval_every, sink=sink, drain_timeout=120)],
    )
    trainer.fit(TinyLM(tiny_lm.new_model(model_config)), loader)
    with open(os.path.join(logger.log_dir, "metrics.csv"), encoding="utf-8") as f:
        logged = [row for row in csv.DictReader(f) if row.get("eval/step")]
    print(f"done: {sink.summary()}; eval rows in {logger.log_dir}/metrics.csv at steps "
          f"{[int(row['step']) for row in logged]}")
    tiny_lm.write_results(args.results, sink.outcomes, logged)
    return 0


if __name__ == "__main__":
    sys.exit(main())

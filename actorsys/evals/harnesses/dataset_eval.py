"""DatasetEval: evaluate datasets on the fleet the pipeline pinned to the checkpoint.

Example::

    datasets = [EvalDataset.from_jsonl("data/math.jsonl", scorer="math", n_samples=4,
                                       temperature=0.7)]
    async with EvalSupervisor.open(config, eval_fn=DatasetEval(datasets), fleet=fleet) as sup:
        ...

Each point reports ``eval/math``, ``eval/math/pass@1``, ``pass@2``, ``pass@4``, ... (see
:mod:`actorsys.evals.scoring.metrics`) and keeps every sample in ``outcome.data["samples"]["math"]``.
"""

from __future__ import annotations

from collections.abc import Sequence

from actorsys._errors import ConfigTypeError
from actorsys.config import require_seconds
from actorsys.contracts import (
    CheckpointEvalFn,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
    model_files,
)
from actorsys.evals.data.dataset import EvalDataset
from actorsys.evals.harnesses.sampling import (
    ScorerWarmUp,
    check_datasets,
    check_limits,
    evaluate_datasets,
)


class DatasetEval(ScorerWarmUp, CheckpointEvalFn):
    """Samples every dataset on the pinned ``input.fleet`` and scores it.

    At most ``concurrency`` requests are in flight; each must be answered within
    ``request_timeout`` seconds and is retried ``retries`` times (on the next engine) before it
    counts as an error, scored 0. Every answer's weight version is checked against the pin (a
    stale one skips the point ``pin_violation``); if every request fails the point skips
    ``unhealthy``, or ``bad_request`` if the engines refused them all (a 4xx, such as a prompt
    too long). A dataset with an ``interval`` is evaluated only at the steps that are a multiple
    of it (the others are named in ``data["not_due"]``). Requests are fitted to the snapshot's
    context first (``max_tokens`` cut to what each prompt leaves). Blocks on the engines; the
    supervisor's ``eval_timeout`` and close cancel it. Bad arguments raise
    :class:`~actorsys.ConfigError` at construction.
    """

    runtime = "trio"

    def __init__(
        self,
        datasets: EvalDataset | Sequence[EvalDataset],
        *,
        concurrency: int = 32,
        request_timeout: float = 120.0,
        retries: int = 2,
    ) -> None:
        super().__init__()
        self.datasets = check_datasets("DatasetEval", datasets)
        check_limits("DatasetEval", concurrency, retries)
        self.concurrency = concurrency
        self.request_timeout = require_seconds("DatasetEval(request_timeout)", request_timeout)
        self.retries = retries

    def __repr__(self) -> str:
        return f"DatasetEval({[d.name for d in self.datasets]})"

    async def evaluate_checkpoint(
        self, checkpoint_dir: str | None, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        """Sample and score every dataset due at the point on ``input.fleet``. Chat prompts
        are rendered by the template of ``checkpoint_dir``, or, for a served point (no
        checkpoint), of ``input.base_checkpoint``; without either a chat dataset skips
        ``no_chat_template`` (never scored on a raw prompt)."""
        if input.fleet is None:
            raise ConfigTypeError(
                "EvalSupervisor.open(fleet)",
                "DatasetEval evaluates on the pipeline's fleet: pass fleet= to "
                "EvalSupervisor.open, or use ServerEvalFn for a server outside the pipeline",
            )
        return await evaluate_datasets(
            input.fleet,
            self.datasets,
            concurrency=self.concurrency,
            request_timeout=self.request_timeout,
            retries=self.retries,
            checkpoint_dir=model_files(checkpoint_dir, input),
            step=input.rollout_id,
        )

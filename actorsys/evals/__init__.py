"""Evaluations that work out of the box: datasets, scorers, and the eval fns that run them.

- :class:`EvalDataset` (``EvalDataset.from_jsonl``), :func:`load_eval_config` (a YAML file of
  datasets) and :func:`datasets_from_args` (miles' eval flags): one definition of what to
  evaluate, shared by the pipeline's fleet, external servers and the watch service.
- :func:`score` and the scorers ``exact``, ``numeric``, ``math`` (math-verify), ``choice``.
- :class:`DatasetEval`: samples and scores datasets on the pipeline's pinned fleet.
- :class:`ServerEvalFn`: the same evaluation on an external vLLM or sglang server, attached to
  or launched, pinned to each checkpoint by the eval fn itself.
- :class:`LmEvalTasks`: lm-evaluation-harness tasks on the pinned fleet (extra ``lm-eval``;
  importing this package does not import lm-eval).
- :class:`OpenAIEvalFn`: an evaluation written against the OpenAI SDK (agent loops, tools,
  judges), its client's door held to the pinned fleet (extra ``openai``).
- :class:`InspectTasks`: inspect-ai tasks on the pinned fleet (extra ``inspect``).

Every public name is imported when first used (:mod:`actorsys._lazy`): a scoring worker
imports ``actorsys.evals.scorers`` and what it needs, not the eval fns around it.
"""

from typing import TYPE_CHECKING

from actorsys._lazy import lazy_names

if TYPE_CHECKING:
    from actorsys.evals.dataset_eval import DatasetEval
    from actorsys.evals.datasets import DatasetError, EvalDataset
    from actorsys.evals.eval_config import load_eval_config
    from actorsys.evals.flags import datasets_from_args
    from actorsys.evals.inspect_tasks import InspectTasks
    from actorsys.evals.lm_eval_tasks import LmEvalTasks
    from actorsys.evals.openai_eval import OpenAIEvalFn
    from actorsys.evals.scorers import SCORERS, score
    from actorsys.evals.server import ServerEvalFn

__all__ = [
    "SCORERS",
    "DatasetError",
    "DatasetEval",
    "EvalDataset",
    "InspectTasks",
    "LmEvalTasks",
    "OpenAIEvalFn",
    "ServerEvalFn",
    "datasets_from_args",
    "load_eval_config",
    "score",
]

__getattr__, __dir__ = lazy_names(
    __name__,
    {
        "DatasetError": "actorsys.evals.datasets",
        "DatasetEval": "actorsys.evals.dataset_eval",
        "EvalDataset": "actorsys.evals.datasets",
        "InspectTasks": "actorsys.evals.inspect_tasks",
        "LmEvalTasks": "actorsys.evals.lm_eval_tasks",
        "OpenAIEvalFn": "actorsys.evals.openai_eval",
        "SCORERS": "actorsys.evals.scorers",
        "ServerEvalFn": "actorsys.evals.server",
        "datasets_from_args": "actorsys.evals.flags",
        "load_eval_config": "actorsys.evals.eval_config",
        "score": "actorsys.evals.scorers",
    },
)

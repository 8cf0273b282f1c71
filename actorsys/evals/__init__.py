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
"""

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

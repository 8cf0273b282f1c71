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
imports ``actorsys.evals.scoring.scorers`` and what it needs, not the eval fns around it.
"""

from typing import TYPE_CHECKING

from actorsys._lazy import lazy_names

PUBLIC: dict[str, str] = {
    "DatasetError": "actorsys._errors",
    "DatasetEval": "actorsys.evals.harnesses.dataset_eval",
    "EvalDataset": "actorsys.evals.data.dataset",
    "InspectTasks": "actorsys.evals.harnesses.inspect_tasks",
    "LmEvalTasks": "actorsys.evals.harnesses.lm_eval_tasks",
    "OpenAIEvalFn": "actorsys.evals.harnesses.openai_eval",
    "SCORERS": "actorsys.evals.scoring.builtin",
    "ServerEvalFn": "actorsys.evals.harnesses.server",
    "datasets_from_args": "actorsys.evals.data.flags",
    "load_eval_config": "actorsys.evals.data.eval_config",
    "score": "actorsys.evals.scoring.scorers",
}
"""Each public name of ``actorsys.evals`` and the module that defines it (as in ``actorsys``)."""

__all__ = [  # sorted(PUBLIC), spelled out for static tools (mkdocstrings); the tests check it
    "DatasetError",
    "DatasetEval",
    "EvalDataset",
    "InspectTasks",
    "LmEvalTasks",
    "OpenAIEvalFn",
    "SCORERS",
    "ServerEvalFn",
    "datasets_from_args",
    "load_eval_config",
    "score",
]
__getattr__, __dir__ = lazy_names(__name__, PUBLIC)

if TYPE_CHECKING:  # the same names, for type checkers (tests/test_public_api.py checks them)
    from actorsys._errors import DatasetError
    from actorsys.evals.data.dataset import EvalDataset
    from actorsys.evals.data.eval_config import load_eval_config
    from actorsys.evals.data.flags import datasets_from_args
    from actorsys.evals.harnesses.dataset_eval import DatasetEval
    from actorsys.evals.harnesses.inspect_tasks import InspectTasks
    from actorsys.evals.harnesses.lm_eval_tasks import LmEvalTasks
    from actorsys.evals.harnesses.openai_eval import OpenAIEvalFn
    from actorsys.evals.harnesses.server import ServerEvalFn
    from actorsys.evals.scoring.builtin import SCORERS
    from actorsys.evals.scoring.scorers import score

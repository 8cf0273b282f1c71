"""Reference evaluations: lm-evaluation-harness tasks on the pinned fleet.

``LmEvalTasks`` needs the extra ``lm-eval``; importing this package does not import lm-eval.
"""

from actorsys.evals.lm_eval_tasks import LmEvalTasks

__all__ = ["LmEvalTasks"]

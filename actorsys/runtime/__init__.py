"""The actor kernel: supervision, blocking calls in threads (also for eval fns), the private
asyncio loop."""

from actorsys.runtime.actor import ActorSupervisor, ChildSpec, Restart, RestartIntensity
from actorsys.runtime.asyncio_thread import AsyncioThread
from actorsys.runtime.blocking import ThreadTracker, run_blocking
from actorsys.runtime.eval_threads import EvalThreads, evaluating_with, run_in_eval_thread

__all__ = [
    "ActorSupervisor",
    "AsyncioThread",
    "ChildSpec",
    "EvalThreads",
    "Restart",
    "RestartIntensity",
    "ThreadTracker",
    "evaluating_with",
    "run_blocking",
    "run_in_eval_thread",
]

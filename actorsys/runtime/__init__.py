"""The actor kernel: supervision, blocking calls in threads (also for eval fns), the private
asyncio loop, and awaiting a ``concurrent.futures.Future`` from trio."""

from actorsys.runtime.actor import ActorSupervisor, ChildSpec, Restart, RestartIntensity
from actorsys.runtime.asyncio_thread import AsyncioThread
from actorsys.runtime.blocking import ThreadTracker, run_blocking
from actorsys.runtime.clock_hold import holding_clock
from actorsys.runtime.eval_threads import EvalThreads, evaluating_with, run_in_eval_thread
from actorsys.runtime.futures import wait_future

__all__ = [
    "ActorSupervisor",
    "AsyncioThread",
    "ChildSpec",
    "EvalThreads",
    "Restart",
    "RestartIntensity",
    "ThreadTracker",
    "evaluating_with",
    "holding_clock",
    "run_blocking",
    "run_in_eval_thread",
    "wait_future",
]

"""The actor kernel: supervision, blocking calls in threads, the private asyncio loop."""

from actorsys.runtime.actor import ActorSupervisor, ChildSpec, Restart, RestartIntensity
from actorsys.runtime.asyncio_thread import AsyncioThread
from actorsys.runtime.blocking import ThreadTracker, run_blocking

__all__ = [
    "ActorSupervisor",
    "AsyncioThread",
    "ChildSpec",
    "Restart",
    "RestartIntensity",
    "ThreadTracker",
    "run_blocking",
]

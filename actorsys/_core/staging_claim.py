"""One staging dir, one job: the claim a supervisor takes on ``hf_dir`` at open.

Opening claims the staging dir with an OS lock (:class:`actorsys._lock.PidLock` on
``<hf_dir>/.actorsys.lock``, the holder's pid written in it), then sweeps the tmp dirs an
earlier, dead run left there. A second supervisor on the same dir (in this process or another)
gets :class:`~actorsys.StagingInUseError` naming the holder's pid and touches nothing. The lock
is released at close, and by the OS when the holding process dies, so a crashed job never
leaves the dir locked. The sweep runs only under the lock: it can never remove a live job's tmp
dirs. At release the lock file is removed while still locked (the lock's own retry keeps two
openers from both holding the dir); a link planted under its name is refused
(:class:`~actorsys._errors.UnsafePathError`), never truncated through.

The hook for a sharded job (``torch.distributed``): the evaluating rank claims the dir with
``lock=True``; the other ranks of the same job open it with ``lock=False``, which prepares the
dir and neither takes the lock nor sweeps (their shards go into the dir the evaluating rank
holds).

Everything here blocks on the file system: ``open_staging`` runs it in a worker thread.
"""

from __future__ import annotations

import logging
import os

import trio

from actorsys import staging
from actorsys._errors import StagingInUseError
from actorsys._lock import PidLock
from actorsys.runtime import ThreadTracker, run_blocking

log = logging.getLogger("actorsys")

LOCK_NAME = ".actorsys.lock"


class StagingClaim:
    """A prepared staging dir (``path``, absolute) and, if this job holds it, its lock."""

    def __init__(self, path: str, lock: PidLock | None) -> None:
        self.path = path
        self._lock = lock

    @property
    def locked(self) -> bool:
        return self._lock is not None and self._lock.held

    def release(self) -> None:
        """Remove the lock file and give the lock back (closing its file releases it).
        Idempotent. Blocking."""
        if self._lock is not None:
            self._lock.release(remove=True)


def claim_staging_dir(path: str, *, lock: bool = True) -> StagingClaim:
    """Prepare ``path``, take its lock (with ``lock``) and sweep it. Blocking.

    Raises :class:`~actorsys.StagingInUseError` if another live supervisor holds the lock,
    :class:`~actorsys.ConfigError` if the dir is unusable.
    """
    path = staging.prepare_staging_dir(path)
    if not lock:
        return StagingClaim(path, None)
    lock_file = PidLock(os.path.join(path, LOCK_NAME), lambda pid: StagingInUseError(path, pid))
    lock_file.acquire()
    claim = StagingClaim(path, lock_file)
    try:
        for removed in staging.sweep(path):
            log.info("removed %s left by an earlier run", removed)
    except BaseException:
        claim.release()
        raise
    return claim


async def open_staging(path: str, tracker: ThreadTracker, *, lock: bool = True) -> StagingClaim:
    """``claim_staging_dir`` in a worker thread, waited for (cancelling waits for it too, and
    a claim taken meanwhile is released)."""
    claim: StagingClaim | None = None

    def take() -> StagingClaim:
        nonlocal claim
        claim = claim_staging_dir(path, lock=lock)
        return claim

    try:
        return await run_blocking(
            take,
            abandon_on_cancel=False,
            limiter=trio.CapacityLimiter(1),
            description=f"opening the staging dir {path}",
            tracker=tracker,
        )
    except BaseException:
        if claim is not None:
            claim.release()
        raise

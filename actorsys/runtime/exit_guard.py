"""Work of ours that may run torch in a thread is stopped and waited for before the
interpreter shuts down.

In CPython 3.11 a daemon thread that takes the GIL back after the interpreter began to
finalize leaves through ``pthread_exit``. Inside a torch op that released the GIL, taking it
back happens in a C++ destructor that may not throw, and the unwind there makes C++ call
``std::terminate``: the process aborts ("terminate called without an active exception",
SIGABRT) after a clean close, and a job scheduler sees a crashed trainer. A hook registered
with ``threading._register_atexit`` runs in ``threading._shutdown``, before finalization
begins and while daemon threads still run, so there the work can still end normally.

Work registers here for as long as it runs (:func:`guarded`, :func:`register`), with a way to ask it to stop
where it has one (a flag it checks between chunks, a close with no budget). At exit the hook
asks every registered piece of work to stop, then waits for all of it together, and for what
registers meanwhile, for at most :data:`EXIT_WAIT_SECONDS`; a Ctrl-C during that wait ends
it. Work that starts only after the wait is not covered: the threads that start work (a
bridge's trio thread) are registered themselves, so the wait outlasts them. Registering costs a lock and an
event; with nothing registered the hook returns at once.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator

log = logging.getLogger("actorsys")

EXIT_WAIT_SECONDS = 10.0
"""How long the interpreter's exit waits, at most, for all the registered work together."""


class Guarded:
    """One piece of registered work: what it is, how to ask it to stop, whether it ended.
    :func:`register` makes one; :meth:`end` takes it off the register."""

    def __init__(self, description: str, stop: Callable[[], None] | None, key: int) -> None:
        self.description = description
        self.stop = stop
        self.ended = threading.Event()
        self._key = key

    def end(self) -> None:
        """The work ended: the exit no longer waits for it. Idempotent; never blocks."""
        with _lock:
            _running.pop(self._key, None)
        self.ended.set()


_lock = threading.Lock()
_running: dict[int, Guarded] = {}
_ids = itertools.count()


def register(description: str, *, stop: Callable[[], None] | None = None) -> Guarded:
    """Register work that runs from now until :meth:`Guarded.end`.

    ``stop`` (called from the exiting thread, never blocking) asks the work to end soon;
    without it the exit can only wait. Never blocks.
    """
    with _lock:
        entry = Guarded(description, stop, next(_ids))
        _running[entry._key] = entry
    return entry


@contextlib.contextmanager
def guarded(description: str, *, stop: Callable[[], None] | None = None) -> Iterator[Guarded]:
    """Register the work of this block until it ends (also by an exception): :func:`register`
    and :meth:`Guarded.end` around it."""
    entry = register(description, stop=stop)
    try:
        yield entry
    finally:
        entry.end()


def start_thread(
    target: Callable[[], None], *, name: str, description: str,
    stop: Callable[[], None] | None = None,
) -> threading.Thread:
    """Start ``target`` in a daemon thread, registered from before it starts until it
    returns: an exit that begins between the start and the thread's first step still waits
    for it (a registration made inside the thread could come too late). Never blocks."""
    entry = register(description, stop=stop)

    def run() -> None:
        try:
            target()
        finally:
            entry.end()

    thread = threading.Thread(target=run, name=name, daemon=True)
    try:
        thread.start()
    except BaseException:
        entry.end()
        raise
    return thread


def running() -> list[str]:
    """What is registered now, by description."""
    with _lock:
        return sorted(entry.description for entry in _running.values())


def stop_and_wait(timeout: float) -> list[str]:
    """Ask every registered piece of work to stop, then wait for all of it together for at
    most ``timeout`` seconds, also for work registered during the wait (a close that goes on
    in another thread starts its clean-up). Returns the descriptions of what still runs.

    Blocks the calling thread for that wait; a stop that raises is logged and waited for
    like work without one.
    """
    deadline = time.monotonic() + timeout
    asked: set[int] = set()
    while True:
        with _lock:
            waiting = dict(_running)
        for key, entry in waiting.items():
            if key not in asked:
                asked.add(key)
                _ask_to_stop(entry)
        for entry in waiting.values():
            entry.ended.wait(max(0.0, deadline - time.monotonic()))
        if not running() or time.monotonic() >= deadline:
            return running()


def _ask_to_stop(entry: Guarded) -> None:
    if entry.stop is not None:
        try:
            entry.stop()
        except Exception:
            log.warning("stopping %s at exit failed", entry.description, exc_info=True)


def _at_exit() -> None:
    """The hook: in the main thread, before the interpreter finalizes."""
    if not running():
        return
    try:
        left = stop_and_wait(EXIT_WAIT_SECONDS)
    except KeyboardInterrupt:  # a second Ctrl-C: exit now rather than wait
        return
    if left:
        log.warning("exiting with work still running in threads (the process may abort): %s",
                    ", ".join(left))


with contextlib.suppress(RuntimeError):  # imported while the interpreter shuts down already
    threading._register_atexit(_at_exit)  # type: ignore[attr-defined]

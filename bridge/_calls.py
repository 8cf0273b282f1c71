"""One request from the host thread to the trio thread, and its answer.

The answer travels in a ``concurrent.futures.Future``, which the host can wait on from a plain
thread (``concurrent.futures.wait``) or from its own asyncio loop (``asyncio.wrap_future``).
Either side may be gone or stuck when the other acts, so every hand-over is a claim:

- the trio side *delivers* through ``set_running_or_notify_cancel``, which fails atomically
  if the host already gave up;
- the host *abandons* through ``Future.cancel``, which fails atomically if the answer is
  already being delivered, in which case the host takes it after all.

So an answer (a reservation, say) is owned by exactly one side, and the side that owns it
cleans it up.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Call(Generic[T]):
    """A request's answer: a value, an exception, or nothing if the host gave up first."""

    def __init__(self, description: str) -> None:
        self.description = description
        self.future: concurrent.futures.Future[T] = concurrent.futures.Future()

    # -- the trio side -----------------------------------------------------------------

    def deliver(self, value: T) -> bool:
        """Hand ``value`` to the host. False if the host gave up: the caller still owns it."""
        if not self.future.set_running_or_notify_cancel():
            return False
        self.future.set_result(value)
        return True

    def fail(self, exc: BaseException) -> bool:
        """Hand ``exc`` to the host to raise. False if the host gave up."""
        if not self.future.set_running_or_notify_cancel():
            return False
        self.future.set_exception(exc)
        return True

    def on_abandon(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (in the host's thread) if the host gives up on this call.

        Called at once, in this thread, if it already has.
        """

        def done(future: concurrent.futures.Future[T]) -> None:
            if future.cancelled():
                callback()

        self.future.add_done_callback(done)

    # -- the host side -----------------------------------------------------------------

    def abandon(self) -> concurrent.futures.Future[T] | None:
        """Stop waiting. None if the trio side will now clean up; otherwise the answer was
        already on its way and the returned (done) future holds it: the host owns it."""
        if self.future.cancel():
            return None
        return self.future



def answer(future: concurrent.futures.Future[T]) -> T:
    """The result of a future that is done or being delivered (raising its exception).

    Blocks only for the instant between the trio side's claim and its ``set_result``.
    """
    return future.result()

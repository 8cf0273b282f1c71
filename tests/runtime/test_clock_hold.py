"""run_blocking holds any autojumping MockClock while its thread runs (trio issue 456), and
lets it go as the thread ends, also when its caller abandoned it."""

from __future__ import annotations

import functools
import threading

import trio
import trio.testing

from actorsys.runtime import ThreadTracker, run_blocking


def works_for_a_moment() -> None:
    """Stands for a delete or an fsync: a thread that takes real time and waits on nothing
    the trio side does."""
    threading.Event().wait(0.05)


async def run_with_deadline(*, hold_clock: bool, abandon_on_cancel: bool = True) -> tuple[bool, float]:
    with trio.move_on_after(1000) as deadline:
        await run_blocking(
            works_for_a_moment,
            abandon_on_cancel=abandon_on_cancel,
            limiter=trio.CapacityLimiter(1),
            description="work",
            tracker=ThreadTracker(),
            hold_clock=hold_clock,
        )
    return deadline.cancelled_caught, trio.current_time()


def test_virtual_time_stands_still_while_the_thread_runs_under_a_users_own_mock_clock() -> None:
    async def main() -> tuple[tuple[bool, float], float]:
        held = await run_with_deadline(hold_clock=True)
        await trio.sleep(10)
        return held, trio.current_time()

    clock = trio.testing.MockClock(autojump_threshold=0)
    assert trio.run(main, clock=clock) == ((False, 0.0), 10.0)


def test_without_the_hold_autojump_fires_a_deadline_while_the_thread_runs() -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)
    assert trio.run(functools.partial(run_with_deadline, hold_clock=False), clock=clock) == (
        True,
        1000.0,
    )


async def test_an_abandoned_thread_holds_the_clock_until_it_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()

    def stuck() -> None:
        entered.set()
        release.wait()
        finished.set()

    caller = trio.CancelScope()

    async def call() -> None:
        with caller:
            await run_blocking(
                stuck, abandon_on_cancel=True, limiter=trio.CapacityLimiter(1),
                description="stuck", tracker=ThreadTracker(),
            )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        await trio.to_thread.run_sync(entered.wait)
        caller.cancel()
    assert not finished.is_set()
    timer = threading.Timer(0.05, release.set)
    timer.start()
    await trio.sleep(100)
    assert finished.is_set() and trio.current_time() == 100
    timer.join()

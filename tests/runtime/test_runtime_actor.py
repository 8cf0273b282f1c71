"""The actor kernel: restart types, restart intensity, giving up, orderly shutdown."""

from __future__ import annotations

import pytest
import trio

from actorsys.runtime import ActorSupervisor, ChildSpec, Restart, RestartIntensity


class Recorder:
    def __init__(self) -> None:
        self.crashes: list[tuple[str, str]] = []
        self.gave_up: list[Exception] = []

    def on_crash(self, name: str, exc: Exception) -> None:
        self.crashes.append((name, str(exc)))

    def on_give_up(self, exc: Exception) -> None:
        self.gave_up.append(exc)


def supervisor(specs: list[ChildSpec], rec: Recorder, *, max_restarts: int = 3,
               period: float = 60.0) -> ActorSupervisor:
    return ActorSupervisor(specs, max_restarts=max_restarts, restart_period=period,
                           on_crash=rec.on_crash, on_give_up=rec.on_give_up)


def test_intensity_allows_max_restarts_within_the_period() -> None:
    intensity = RestartIntensity(2, 10.0)
    assert intensity.allow(0.0) and intensity.allow(1.0)
    assert not intensity.allow(2.0)
    assert intensity.allow(10.5)


async def test_crashed_transient_child_is_restarted_and_peers_keep_running() -> None:
    rec = Recorder()
    runs = {"crashy": 0, "steady": 0}
    steady_alive = trio.Event()

    async def crashy() -> None:
        runs["crashy"] += 1
        if runs["crashy"] <= 2:
            raise RuntimeError(f"boom {runs['crashy']}")

    async def steady() -> None:
        runs["steady"] += 1
        steady_alive.set()
        await trio.sleep_forever()

    sup = supervisor([ChildSpec("crashy", crashy), ChildSpec("steady", steady)], rec)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        await steady_alive.wait()
        await trio.testing.wait_all_tasks_blocked()
        sup.cancel()
    assert runs == {"crashy": 3, "steady": 1}
    assert rec.crashes == [("crashy", "boom 1"), ("crashy", "boom 2")]
    assert sup.restarts == 2 and not rec.gave_up


async def test_too_many_restarts_in_the_period_gives_up_and_cancels_every_child() -> None:
    rec = Recorder()
    peer_cancelled = trio.Event()

    async def crashy() -> None:
        raise RuntimeError("always")

    async def peer() -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            peer_cancelled.set()
            raise

    sup = supervisor([ChildSpec("crashy", crashy), ChildSpec("peer", peer)], rec, max_restarts=3)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
    assert len(rec.crashes) == 4
    assert sup.restarts == 3
    assert [str(e) for e in rec.gave_up] == ["always"]
    assert sup.gave_up is rec.gave_up[0]
    assert peer_cancelled.is_set()


async def test_restarts_spread_beyond_the_period_never_give_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rec = Recorder()
    runs = 0

    async def crash_every_ten_seconds() -> None:
        nonlocal runs
        runs += 1
        if runs > 6:
            return
        await trio.sleep(10)
        raise RuntimeError("slow crash")

    sup = supervisor([ChildSpec("slow", crash_every_ten_seconds)], rec, max_restarts=2, period=15.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
    assert sup.restarts == 6 and not rec.gave_up


async def test_temporary_child_is_never_restarted() -> None:
    rec = Recorder()
    runs = 0

    async def once() -> None:
        nonlocal runs
        runs += 1
        raise RuntimeError("once")

    sup = supervisor([ChildSpec("once", once, Restart.TEMPORARY)], rec)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
    assert runs == 1 and sup.restarts == 0


async def test_permanent_child_is_restarted_after_a_normal_return() -> None:
    rec = Recorder()
    runs = 0

    async def returns() -> None:
        nonlocal runs
        runs += 1
        if runs == 3:
            await trio.sleep_forever()

    sup = supervisor([ChildSpec("perm", returns, Restart.PERMANENT)], rec)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        await trio.testing.wait_all_tasks_blocked()
        sup.cancel()
    assert runs == 3 and sup.restarts == 2 and not rec.crashes


async def test_cancellation_is_not_a_crash() -> None:
    rec = Recorder()

    async def forever() -> None:
        await trio.sleep_forever()

    sup = supervisor([ChildSpec("forever", forever)], rec)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        sup.cancel()
    assert not rec.crashes and sup.restarts == 0


async def test_keyboard_interrupt_is_never_caught() -> None:
    rec = Recorder()

    async def interrupted() -> None:
        raise KeyboardInterrupt

    sup = supervisor([ChildSpec("ki", interrupted)], rec)
    with pytest.raises(BaseExceptionGroup) as caught:
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
    assert caught.group_contains(KeyboardInterrupt)
    assert not rec.crashes


async def test_shutdown_stops_children_in_order_and_cancels_a_child_past_its_budget(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rec = Recorder()
    stopped: list[str] = []
    first_stop = trio.Event()

    async def polite() -> None:
        await first_stop.wait()
        stopped.append("polite")

    async def stubborn() -> None:
        try:
            await trio.sleep_forever()
        finally:
            stopped.append(f"stubborn at {trio.current_time():.0f}")

    sup = supervisor(
        [ChildSpec("polite", polite, shutdown=1.0, stop=first_stop.set),
         ChildSpec("stubborn", stubborn, shutdown=5.0)],
        rec,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        await sup.shutdown()
    assert stopped == ["polite", "stubborn at 5"]

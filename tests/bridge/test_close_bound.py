"""close() returns within its budget whatever way an evaluation hangs (real threads, servers
and processes; wall clock, so each test is bounded by pytest-timeout)."""

from __future__ import annotations

import asyncio
import time

import pytest
from hangs import SCENARIOS

from actorsys import EvalConfig
from bridge import TRIO_THREAD, AsyncEvalBridge, EvalBridge

T = 1.0
# Room for a loaded machine: a hang the close did not cut would run far past it (the
# tests time out); how close close() keeps to T is measured in bench/close_bound.py.
SLACK = 3.0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_close_is_bounded_and_names_the_abandoned_step(scenario: str, checkpoint_dir: str) -> None:
    with SCENARIOS[scenario]() as eval_fn:
        bridge = EvalBridge(EvalConfig(), eval_fn=eval_fn)
        with bridge:
            assert bridge.submit(7, checkpoint_dir=checkpoint_dir)
            assert eval_fn.entered.wait(10)
            started = time.monotonic()
            report = bridge.close(timeout=T)
            elapsed = time.monotonic() - started
        assert elapsed < T + SLACK
        assert report.abandoned == [7]
        assert not report.clean
        assert bridge.close() is report


@pytest.mark.timeout(30)
def test_close_reports_a_thread_it_had_to_leave_behind(checkpoint_dir: str) -> None:
    with SCENARIOS["thread_stuck_in_blocking_call"]() as eval_fn, EvalBridge(
        EvalConfig(), eval_fn=eval_fn
    ) as bridge:
        bridge.submit(3, checkpoint_dir=checkpoint_dir)
        assert eval_fn.entered.wait(10)
        report = bridge.close(timeout=T)
    assert report.stuck_threads == ["eval of step 3"]


@pytest.mark.timeout(30)
def test_close_answers_for_a_wedged_trio_thread_from_the_host_side(checkpoint_dir: str) -> None:
    with SCENARIOS["trio_thread_wedged"]() as eval_fn:
        bridge = EvalBridge(EvalConfig(overflow="skip"), eval_fn=eval_fn, handoff_timeout=0.2)
        with bridge:
            assert bridge.submit(1, checkpoint_dir=checkpoint_dir)
            assert eval_fn.entered.wait(10)
            started = time.monotonic()
            assert bridge.submit(2, checkpoint_dir=checkpoint_dir) is False
            assert time.monotonic() - started < 0.2 + SLACK
            report = bridge.close(timeout=T)
    assert report.abandoned == [1]
    assert report.stuck_threads == [TRIO_THREAD]


@pytest.mark.timeout(30)
def test_async_close_is_bounded_while_an_asyncio_eval_hangs(checkpoint_dir: str) -> None:
    async def host() -> tuple[float, list[int]]:
        with SCENARIOS["asyncio_eval_awaits_forever"]() as eval_fn:
            async with AsyncEvalBridge(EvalConfig(), eval_fn=eval_fn) as bridge:
                assert await bridge.submit(5, checkpoint_dir=checkpoint_dir)
                assert await asyncio.to_thread(eval_fn.entered.wait, 10)
                started = time.monotonic()
                report = await bridge.close(timeout=T)
                return time.monotonic() - started, report.abandoned

    elapsed, abandoned = asyncio.run(host())
    assert elapsed < T + SLACK
    assert abandoned == [5]


@pytest.mark.timeout(30)
def test_close_in_finally_during_keyboard_interrupt_cuts_off_the_eval(checkpoint_dir: str) -> None:
    with SCENARIOS["trio_eval_never_returns"]() as eval_fn:
        bridge = EvalBridge(EvalConfig(close_timeout=T), eval_fn=eval_fn)

        def train_until_interrupted() -> None:
            with bridge:
                bridge.submit(9, checkpoint_dir=checkpoint_dir)
                assert eval_fn.entered.wait(10)
                raise KeyboardInterrupt

        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            train_until_interrupted()
        assert time.monotonic() - started < T + SLACK
    assert bridge.close().abandoned == [9]

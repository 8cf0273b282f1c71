"""The hand-over of one answer between the trio thread and the host: exactly one side ends
up owning it (deterministic, no threads)."""

from __future__ import annotations

import asyncio

import pytest

from bridge._budgets import drains_on_exit, trio_share
from bridge._calls import Call, answer


def test_an_answer_delivered_after_the_host_gave_up_stays_with_the_trio_side() -> None:
    call: Call[str] = Call("reserve")
    assert call.abandon() is None
    assert call.deliver("slot") is False


def test_an_answer_delivered_before_the_host_gave_up_goes_to_the_host() -> None:
    call: Call[str] = Call("reserve")
    assert call.deliver("slot")
    future = call.abandon()
    assert future is not None
    assert answer(future) == "slot"


def test_an_error_reaches_the_host_as_raised() -> None:
    call: Call[str] = Call("reserve")
    call.fail(ValueError("bad step"))
    future = call.abandon()
    assert future is not None
    with pytest.raises(ValueError, match="bad step"):
        answer(future)


def test_on_abandon_runs_when_the_host_gives_up_and_at_once_if_it_already_has() -> None:
    call: Call[str] = Call("reserve")
    heard: list[str] = []
    call.on_abandon(lambda: heard.append("first"))
    call.abandon()
    call.on_abandon(lambda: heard.append("late"))
    assert heard == ["first", "late"]


def test_on_abandon_does_not_run_for_an_answered_call() -> None:
    call: Call[str] = Call("drain")
    heard: list[str] = []
    call.on_abandon(lambda: heard.append("abandoned"))
    call.deliver("report")
    call.abandon()
    assert heard == []


@pytest.mark.parametrize(
    ("exc", "drains"),
    [
        (None, True),
        (RuntimeError("training diverged"), True),
        (KeyboardInterrupt(), False),
        (SystemExit(1), False),
        (asyncio.CancelledError(), False),
    ],
)
def test_leaving_on_an_interrupt_cuts_off_instead_of_draining(
    exc: BaseException | None, drains: bool
) -> None:
    assert drains_on_exit(exc) is drains


@pytest.mark.parametrize(("budget", "share"), [(2.0, 1.9), (30.0, 29.75), (0.0, 0.0)])
def test_the_trio_side_gets_the_budget_less_the_hand_back(budget: float, share: float) -> None:
    assert trio_share(budget) == pytest.approx(share)

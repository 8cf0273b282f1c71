"""The watcher's decisions, without files or a supervisor: what is due, what waits for the
next generation, what a settled outcome writes to the ledger."""

from __future__ import annotations

import pytest

from actorsys.outcome import Outcome
from actorsys.watch import policy
from actorsys.watch.ledger import DONE, FAILED, SKIPPED, VANISHED
from actorsys.watch.scan import Checkpoint


def ckpt(step: int, name: str | None = None) -> Checkpoint:
    name = name or f"step_{step}"
    return Checkpoint(step, name, f"/ckpt/{name}", marked=True)


FOUND = [ckpt(10), ckpt(20), ckpt(20, "other_20"), ckpt(30)]


def test_catchup_latest_leaves_every_step_but_the_newest_and_all_leaves_none() -> None:
    assert policy.left_behind(FOUND, "latest") == {"step_10", "step_20", "other_20"}
    assert policy.left_behind(FOUND, "all") == set()
    assert policy.left_behind([], "latest") == set()


def test_due_skips_the_ignored_the_claimed_and_the_settled_in_scan_order() -> None:
    settled = {"step_30"}
    due = policy.due(FOUND, ignored={"step_10"}, claimed={"other_20"},
                     unsettled=lambda c: c.name not in settled)
    assert [c.name for c in due] == ["step_20"]
    assert policy.due(FOUND, ignored=(), claimed=(), unsettled=lambda c: True) == FOUND


def test_a_step_is_submitted_once_a_generation_and_its_second_checkpoint_waits() -> None:
    take, waiting = policy.this_generation(FOUND, submitted=set())
    assert [c.name for c in take] == ["step_10", "step_20", "step_30"] and waiting
    take, waiting = policy.this_generation([ckpt(20, "other_20"), ckpt(40)], submitted={20})
    assert [c.name for c in take] == ["step_40"] and waiting
    assert policy.this_generation([ckpt(40)], submitted={20}) == ([ckpt(40)], False)


@pytest.mark.parametrize(
    ("in_flight", "waiting", "once", "then"),
    [
        (True, True, True, "poll"),
        (True, False, False, "poll"),
        (False, True, True, "next_generation"),
        (False, True, False, "next_generation"),
        (False, False, True, "stop"),
        (False, False, False, "poll"),
    ],
)
def test_after_submitting(in_flight: bool, waiting: bool, once: bool, then: str) -> None:
    assert policy.after_submitting(in_flight=in_flight, waiting=waiting, once=once) == then


def statuses(settlement: policy.Settlement) -> list[str]:
    return [status for status, _ in settlement.entries]


def test_ok_is_done_and_closed_is_no_attempt() -> None:
    done = policy.settle(True, None, vanished=False, attempts=2, max_attempts=3)
    assert statuses(done) == [DONE] and done.report == "ok" and done.given_up is None
    closed = policy.settle(False, policy.CLOSED, vanished=True, attempts=2, max_attempts=3)
    assert closed == policy.Settlement()
    assert not policy.needs_presence_check(False, policy.CLOSED)
    assert not policy.needs_presence_check(True, None)
    assert policy.needs_presence_check(False, "unhealthy")


def test_a_failure_is_retried_until_its_last_allowed_attempt() -> None:
    first = policy.settle(False, "unhealthy", vanished=False, attempts=0, max_attempts=3)
    assert first.entries == [(SKIPPED, {"reason": "unhealthy"})] and first.report is None
    last = policy.settle(False, "unhealthy", vanished=False, attempts=2, max_attempts=3)
    assert last.entries == [(SKIPPED, {"reason": "unhealthy"}), (FAILED, {"reason": "unhealthy"})]
    assert last.report == "failed" and last.given_up == "failed 3 times (unhealthy)"
    once = policy.settle(False, "unhealthy", vanished=False, attempts=0, max_attempts=1)
    assert statuses(once) == [SKIPPED, FAILED]


def test_a_bad_request_fails_at_once_and_a_vanished_checkpoint_is_no_attempt() -> None:
    bad = policy.settle(False, policy.BAD_REQUEST, vanished=False, attempts=0, max_attempts=3,
                        error="prompt too long")
    assert bad.entries == [
        (SKIPPED, {"reason": policy.BAD_REQUEST}),
        (FAILED, {"reason": policy.BAD_REQUEST, "error": "prompt too long"}),
    ]
    assert bad.report == "failed" and "prompt too long" in (bad.given_up or "")
    gone = policy.settle(False, "ckpt_invalid", vanished=True, attempts=2, max_attempts=3)
    assert gone.entries == [(VANISHED, {"reason": "ckpt_invalid"})] and gone.report == "vanished"


def test_error_of_reads_the_outcomes_error() -> None:
    def outcome(data: object) -> Outcome:
        return Outcome(step=1, status="skipped", reason="x", data=data)

    assert policy.error_of(outcome({"error": 3})) == "3"
    assert policy.error_of(outcome({"other": 1})) is None
    assert policy.error_of(outcome(None)) is None

"""Work registered with the exit guard is stopped and waited for when the interpreter exits,
before daemon threads are cut off, and never for longer than the guard's bound."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from actorsys.runtime import exit_guard

WORKER = """
import threading
from actorsys.runtime import exit_guard

exit_guard.EXIT_WAIT_SECONDS = {bound}
entered = threading.Event()
stop = threading.Event()

def work():
    with exit_guard.guarded("work", stop={stop}):
        entered.set()
        stop.wait()
        print("stopped at exit", flush=True)

threading.Thread(target=work, daemon=True).start()
entered.wait()
print("leaving main", flush=True)
"""


def run_worker(*, bound: float, stoppable: bool) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(WORKER.format(bound=bound, stop="stop.set" if stoppable else None))
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )


@pytest.mark.timeout(90)
def test_exit_stops_a_daemon_thread_and_waits_for_it_to_end() -> None:
    done = run_worker(bound=30, stoppable=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["leaving main", "stopped at exit"]


@pytest.mark.timeout(90)
def test_exit_waits_no_longer_than_its_bound_for_work_it_cannot_stop() -> None:
    done = run_worker(bound=0.2, stoppable=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["leaving main"]
    assert "work still running in threads" in done.stderr and "work" in done.stderr


def test_stop_and_wait_asks_each_piece_of_work_to_stop_and_names_what_did_not_end() -> None:
    asked: list[str] = []
    with exit_guard.guarded("stoppable", stop=lambda: asked.append("stoppable")) as first, \
            exit_guard.guarded("unstoppable") as second:
        assert {"stoppable", "unstoppable"} <= set(exit_guard.running())
        assert {"stoppable", "unstoppable"} <= set(exit_guard.stop_and_wait(0.0))
        assert asked == ["stoppable"]
        assert not first.ended.is_set() and not second.ended.is_set()
    assert first.ended.is_set() and second.ended.is_set()
    assert not {"stoppable", "unstoppable"} & set(exit_guard.running())


def test_a_stop_that_fails_is_logged_and_the_others_are_still_asked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def fail() -> None:
        raise RuntimeError("cannot stop")

    asked: list[str] = []
    with exit_guard.guarded("failing stop", stop=fail), \
            exit_guard.guarded("other", stop=lambda: asked.append("other")):
        left = exit_guard.stop_and_wait(0.0)
    assert {"failing stop", "other"} <= set(left)
    assert asked == ["other"]
    assert any("stopping failing stop at exit failed" in r.getMessage() for r in caplog.records)


STARTED_AT_EXIT = """
import threading
from actorsys.runtime import exit_guard

stop = threading.Event()

def work():
    stop.wait()
    print("stopped at exit", flush=True)

exit_guard.start_thread(work, name="late", description="late work", stop=stop.set)
print("leaving main", flush=True)
"""


def test_a_thread_started_just_before_exit_is_waited_for_before_its_first_step() -> None:
    # main leaves at once: only a registration made before the thread starts covers it
    done = subprocess.run(
        [sys.executable, "-c", STARTED_AT_EXIT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["leaving main", "stopped at exit"]


def test_start_thread_registers_until_its_target_returns() -> None:
    import threading

    go = threading.Event()
    thread = exit_guard.start_thread(go.wait, name="t", description="waiting work")
    assert "waiting work" in exit_guard.running()
    go.set()
    thread.join(timeout=30)
    assert "waiting work" not in exit_guard.running()

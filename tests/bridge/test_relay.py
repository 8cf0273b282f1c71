"""Commands a host posts detached (the last step of a submit: the relay thread wakes the trio
thread) reach the dispatcher in the order posted, with the ones posted directly; after the
trio thread ends, a detached command is refused and the relay thread ends too."""

from __future__ import annotations

import threading

import pytest
from hangs import TrioForever

from actorsys import EvalConfig
from bridge import EvalBridge
from bridge._thread import RELAY_NAME, Command


@pytest.mark.timeout(60)
def test_detached_and_direct_commands_run_in_the_order_posted() -> None:
    ran: list[int] = []
    done = threading.Event()
    total = 400
    with EvalBridge(EvalConfig(), eval_fn=TrioForever()) as bridge:
        trio_thread = bridge._rt.trio

        def record(n: int) -> Command:
            def run(nursery: object) -> None:
                ran.append(n)
                if n == total - 1:
                    done.set()
            return Command(run)

        for n in range(total):
            trio_thread.post(record(n), detached=n % 3 != 2)
        assert done.wait(30)
    assert ran == list(range(total))


@pytest.mark.timeout(60)
def test_after_the_trio_thread_ended_a_detached_command_is_refused_and_the_relay_ends() -> None:
    refused = threading.Event()
    bridge = EvalBridge(EvalConfig(), eval_fn=TrioForever())
    with bridge:
        trio_thread = bridge._rt.trio
        trio_thread.post(Command(lambda nursery: None), detached=True)
    assert bridge.close().clean
    trio_thread.post(Command(lambda nursery: None, refuse=refused.set), detached=True)
    assert refused.wait(10)
    relays = [t for t in threading.enumerate() if t.name == RELAY_NAME]
    for relay in relays:
        relay.join(10)
    assert not any(relay.is_alive() for relay in relays)

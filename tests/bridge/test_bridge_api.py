"""EvalBridge from a plain host thread: start-up errors, misuse, backpressure bounded by the
host's own timeout, drain reports, interrupts (a real trio thread; each test is bounded)."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from hangs import SCENARIOS, TrioForever

from actorsys import (
    ConfigError,
    DuplicateStepError,
    EvalConfig,
    SubmitError,
    SupervisorClosedError,
)
from bridge import EvalBridge


@pytest.mark.timeout(30)
def test_enter_raises_the_supervisors_start_up_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    bridge = EvalBridge(EvalConfig(hf_dir=not_a_dir), eval_fn=TrioForever())
    with pytest.raises(ConfigError) as caught, bridge:
        pass  # pragma: no cover
    assert caught.value.field == "hf_dir"
    assert bridge.close().clean


@pytest.mark.timeout(30)
def test_enter_raises_for_an_eval_fn_without_evaluate_checkpoint() -> None:
    with pytest.raises(ConfigError) as caught, EvalBridge(EvalConfig(), eval_fn=object()):
        pass  # pragma: no cover
    assert caught.value.field == "eval_fn"


@pytest.mark.timeout(30)
def test_misuse_raises_in_the_host_and_changes_nothing(checkpoint_dir: str) -> None:
    with SCENARIOS["trio_eval_never_returns"]() as eval_fn, EvalBridge(
        EvalConfig(), eval_fn=eval_fn
    ) as bridge:
        with pytest.raises(SubmitError):
            bridge.submit(1, checkpoint_dir=checkpoint_dir, state_dict={"w": torch.zeros(1)})
        assert bridge.submit(1, checkpoint_dir=checkpoint_dir)
        with pytest.raises(DuplicateStepError):
            bridge.submit(1, checkpoint_dir=checkpoint_dir)
        bridge.close(timeout=1)
        with pytest.raises(SupervisorClosedError):
            bridge.submit(2, checkpoint_dir=checkpoint_dir)


@pytest.mark.timeout(30)
def test_a_backpressure_wait_ends_at_the_hosts_timeout_and_admits_nothing(
    checkpoint_dir: str,
) -> None:
    config = EvalConfig(max_in_flight=1)
    with SCENARIOS["trio_eval_never_returns"]() as eval_fn, EvalBridge(
        config, eval_fn=eval_fn
    ) as bridge:
        assert bridge.submit(1, checkpoint_dir=checkpoint_dir)
        started = time.monotonic()
        assert bridge.submit(2, checkpoint_dir=checkpoint_dir, timeout=0.3) is False
        assert 0.25 <= time.monotonic() - started < 1.0
        assert bridge.submit(2, checkpoint_dir=checkpoint_dir, timeout=0.1) is False
        assert bridge.statistics().settled == 0
        report = bridge.close(timeout=1)
    assert report.abandoned == [1]


@pytest.mark.timeout(30)
def test_a_backpressure_submit_is_admitted_once_a_slot_frees(checkpoint_dir: str) -> None:
    config = EvalConfig(max_in_flight=1, eval_timeout=0.3)
    with SCENARIOS["trio_eval_never_returns"]() as eval_fn, EvalBridge(
        config, eval_fn=eval_fn
    ) as bridge:
        assert bridge.submit(1, checkpoint_dir=checkpoint_dir)
        assert bridge.submit(2, checkpoint_dir=checkpoint_dir, timeout=10)
        assert bridge.statistics().skipped_by_reason == {"timeout": 1}
        bridge.close(timeout=1)


@pytest.mark.timeout(30)
def test_drain_reports_what_is_still_pending_when_its_budget_runs_out(
    checkpoint_dir: str,
) -> None:
    with SCENARIOS["trio_eval_never_returns"]() as eval_fn, EvalBridge(
        EvalConfig(), eval_fn=eval_fn
    ) as bridge:
        bridge.submit(4, checkpoint_dir=checkpoint_dir)
        started = time.monotonic()
        report = bridge.drain(timeout=0.3)
        assert time.monotonic() - started < 0.3 + 0.5
        assert report.pending == [4]
        assert report.settled == []
        bridge.close(timeout=1)


@pytest.mark.timeout(30)
def test_an_interrupt_during_a_backpressure_wait_admits_nothing(checkpoint_dir: str) -> None:
    config = EvalConfig(max_in_flight=1)
    main = threading.get_ident()
    with SCENARIOS["trio_eval_never_returns"]() as eval_fn, EvalBridge(
        config, eval_fn=eval_fn
    ) as bridge:
        assert bridge.submit(1, checkpoint_dir=checkpoint_dir)
        ctrl_c = threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGINT))
        ctrl_c.start()
        with pytest.raises(KeyboardInterrupt):
            bridge.submit(2, checkpoint_dir=checkpoint_dir)
        ctrl_c.join()
        assert bridge.submit(2, checkpoint_dir=checkpoint_dir, timeout=0.1) is False
        report = bridge.close(timeout=1)
    assert report.abandoned == [1]

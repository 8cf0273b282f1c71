"""A step is ASCII digits at the very end of a directory name: no other script's digits, no
trailing newline."""

from __future__ import annotations

import pytest

from actorsys.watch.scan import TRAINER_CHECKPOINT, step_of


@pytest.mark.parametrize("name", ["step_\u0665", "step_\uff15", "step_5\n", "checkpoint-\u0665"])
def test_watch_takes_only_ascii_digits_as_a_step(name: str) -> None:
    assert step_of(name) is None
    assert not TRAINER_CHECKPOINT.search(name)
    assert step_of("step_5") == 5 and step_of("checkpoint-0012") == 12

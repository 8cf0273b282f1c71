"""The settings of sharded (collective) jobs: ``eval_rank`` and ``collective_timeout``."""

from __future__ import annotations

import argparse

import pytest

from actorsys import ConfigError, EvalConfig
from actorsys.supervisor import is_collective_job


def test_eval_rank_comes_from_its_flag() -> None:
    parser = argparse.ArgumentParser()
    EvalConfig.add_arguments(parser)
    config = EvalConfig.from_args(parser.parse_args(["--eval-rank", "3"]))
    assert config.eval_rank == 3
    assert EvalConfig().eval_rank == 0


@pytest.mark.parametrize(("field", "value"), [("eval_rank", -1), ("collective_timeout", 0)])
def test_bad_collective_settings_name_their_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        EvalConfig(**{field: value})  # type: ignore[arg-type]


def test_a_process_without_torch_distributed_is_not_a_collective_job() -> None:
    assert not is_collective_job()

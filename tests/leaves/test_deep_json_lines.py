"""A JSONL line nested too deeply for the parser (200,000 brackets: a RecursionError inside
json.loads) is a clear error naming the file and the line in a dataset, and a skipped, logged
line in the watch ledger, never a crash."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from actorsys.evals import EvalDataset
from actorsys.evals.data.dataset import DatasetError
from actorsys.watch.ledger import Ledger

DEEP = "[" * 200_000 + "]" * 200_000


def test_a_dataset_line_nested_too_deeply_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "p", "label": "l"}) + "\n" + DEEP + "\n")
    with pytest.raises(DatasetError, match=r"d\.jsonl, line 2: JSON nested too deeply") as caught:
        EvalDataset.from_jsonl(path)
    assert (caught.value.path, caught.value.line) == (str(path), 2)


def test_a_ledger_line_nested_too_deeply_is_skipped_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.jsonl"
    good = {"checkpoint": "step_1", "fingerprint": "f", "step": 1, "eval_key": "k", "status": "ok"}
    path.write_text(DEEP + "\n" + json.dumps(good) + "\n")
    with caplog.at_level(logging.WARNING):
        ledger = Ledger(path)
    assert not ledger.due("step_1", "f", "k", max_attempts=3)
    assert f"{path} line 1 is torn or not a ledger entry" in caplog.text

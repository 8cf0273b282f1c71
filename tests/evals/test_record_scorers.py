"""A record names only built-in scorers: a dataset's ``metadata.rm_type`` that is anything else
(a dotted path above all) is that record's scorer error, counted, and never imported, in the
trainer's process or in the scoring workers. Dotted paths come only from the configuration, and
loading one survives a module that exits at import."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from actorsys import ConfigError
from actorsys.evals import EvalDataset, score
from actorsys.evals.harnesses.sampling import pool_scorer, score_answers
from actorsys.evals.scoring.grading import RefusedScorer, record_scorer
from actorsys.evals.scoring.metrics import dataset_metrics
from actorsys.evals.scoring.scorers import load_scorer
from actorsys.fleet.clients.completions import Completion


def completions(*texts: str) -> list[Completion]:
    return [Completion(i, "p", text, "stop", "1", "fake://", 3) for i, text in enumerate(texts)]


@pytest.fixture
def canary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module ``rm_canary`` on the path that leaves a file behind when it is imported."""
    touched = tmp_path / "imported"
    (tmp_path / "rm_canary.py").write_text(
        f"open({str(touched)!r}, 'w').close()\n\ndef fn(answer, label, record):\n    return 1.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("rm_canary", None)
    return touched


@pytest.mark.timeout(120)
async def test_a_records_rm_type_that_is_no_builtin_is_its_scorer_error_and_runs_nothing(
    tmp_path: Path,
) -> None:
    ran = tmp_path / "ran"
    code = f"open({str(ran)!r}, 'w').close()"
    records = (
        # exec(answer, label, record): the answer runs as Python where the path is imported
        {"prompt": "a", "label": {}, "meta": {"rm_type": "builtins.exec"}},
        # timeit.timeit(stmt=answer, setup=label, timer=record): the label runs as Python
        {"prompt": "b", "label": code, "meta": {"rm_type": "timeit.timeit"}},
        {"prompt": "c", "label": "4", "meta": {"rm_type": "fuzzy"}},
        {"prompt": "d", "label": "4", "meta": {"rm_type": 7}},
        {"prompt": "e", "label": "4", "meta": {"rm_type": "boxed_math"}},
    )
    dataset = EvalDataset(name="mixed", records=records, metadata_key="meta", scorer="exact")
    samples = await score_answers(dataset, completions(code, "pass", "4", "4", "\\boxed{4}"))
    assert not ran.exists()
    assert [s.score for s in samples] == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert [s.error is not None for s in samples] == [True, True, True, True, False]
    assert "is not a built-in scorer" in str(samples[0].error)
    assert dataset_metrics("mixed", samples, 1)["eval/mixed/scorer_errors"] == 4.0


def test_a_dotted_rm_type_is_never_imported_in_the_trainers_process(canary: Path) -> None:
    records = ({"prompt": "a", "label": "4", "meta": {"rm_type": "rm_canary.fn"}},)
    dataset = EvalDataset(name="d", records=records, metadata_key="meta")
    assert isinstance(dataset.scorer_of(0), RefusedScorer)
    with pytest.raises(ValueError, match=r"'rm_canary.fn' is not a built-in scorer"):
        score(pool_scorer(dataset), "4", "4", {"record": records[0], "metadata": records[0]["meta"]})
    assert not canary.exists()
    assert "rm_canary" not in sys.modules


def test_a_dotted_path_from_the_configuration_still_grades_every_record(canary: Path) -> None:
    assert record_scorer("rm_canary.fn", {"rm_type": "math"}) == "rm_canary.fn"
    records = ({"prompt": "a", "label": "4", "meta": {"rm_type": "builtins.exec"}},)
    dataset = EvalDataset(name="d", records=records, metadata_key="meta", scorer="rm_canary.fn")
    assert canary.exists()  # the user's own path is imported (checked at construction)
    assert score(pool_scorer(dataset), "x", "4", {"record": records[0]}) == 1.0


def test_loading_a_scorer_that_exits_at_import_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "exits_at_import.py").write_text("raise SystemExit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"exits_at_import.fn' does not import: SystemExit"):
        load_scorer("exits_at_import.fn")
    with pytest.raises(ConfigError, match="does not import"):
        EvalDataset(name="d", records=({"prompt": "a", "label": "4"},),
                    scorer="exits_at_import.fn")


def test_an_interrupt_while_a_scorer_imports_still_interrupts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "interrupts_at_import.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        load_scorer("interrupts_at_import.fn")



"""Small inputs with large effects: each is refused with a bounded message."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from actorsys.evals import DatasetError, EvalDataset, load_eval_config

BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
defaults:
  n_samples: *i
datasets:
  - {name: x, path: x.jsonl}
"""


def test_a_yaml_alias_bomb_is_refused_with_a_short_message(tmp_path: Path) -> None:
    config = tmp_path / "eval.yaml"
    config.write_text(BOMB)
    (tmp_path / "x.jsonl").write_text('{"prompt": "p", "label": "1"}\n')
    started = time.monotonic()
    with pytest.raises(DatasetError, match="expands to more than") as refused:
        load_eval_config(config)
    assert len(str(refused.value)) < 1000
    assert time.monotonic() - started < 10


def test_a_moderate_alias_still_works(tmp_path: Path) -> None:
    config = tmp_path / "eval.yaml"
    config.write_text("defaults: &d {n_samples: 2}\ndatasets:\n  - {name: x, path: x.jsonl}\n")
    (tmp_path / "x.jsonl").write_text('{"prompt": "p", "label": "1"}\n')
    assert load_eval_config(config)[0].n_samples == 2


@pytest.mark.parametrize("label", ["1" + "0" * 400, "1e309", '"1e309"', '"inf"', '"nan"'])
def test_a_numeric_label_beyond_a_float_is_a_dataset_error(tmp_path: Path, label: str) -> None:
    data = tmp_path / "x.jsonl"
    data.write_text(f'{{"prompt": "p", "label": {label}}}\n')
    with pytest.raises(DatasetError, match="label"):
        EvalDataset.from_jsonl(data, scorer="numeric")


def test_a_dataset_error_quotes_a_bounded_excerpt(tmp_path: Path) -> None:
    data = tmp_path / "x.jsonl"
    data.write_text(json.dumps({"prompt": "p", "label": "x" * 1_000_000}) + "\n")
    with pytest.raises(DatasetError) as refused:
        EvalDataset.from_jsonl(data, scorer="numeric")
    assert len(str(refused.value)) < 3000

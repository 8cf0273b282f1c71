"""EvalDataset.from_jsonl and load_eval_config: what a good file gives, and how a bad one fails
(at construction, naming the file, the line and the key)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actorsys import ConfigError
from actorsys.evals import DatasetError, EvalDataset, load_eval_config


def write_jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_from_jsonl_reads_records_and_names_the_dataset_after_the_file(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "arith.jsonl", [{"prompt": "1+1=", "label": "2"},
                                                   {"prompt": "2+2=", "label": "4"}])
    dataset = EvalDataset.from_jsonl(path, n_samples=3, temperature=0.5, stop="\n")
    assert dataset.name == "arith"
    assert dataset.prompts == ["1+1=", "2+2="]
    assert dataset.labels == ["2", "4"]
    assert (dataset.n_samples, dataset.temperature, dataset.stop) == (3, 0.5, ("\n",))
    assert dataset.sampling_kwargs() == {
        "max_tokens": 256, "temperature": 0.5, "extra": {"top_p": 1.0, "stop": ["\n"]}
    }


def test_limit_reads_only_the_first_records_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"q": "a", "a": 1}\n\n{"q": "b", "a": 2}\nnot json\n')
    dataset = EvalDataset.from_jsonl(path, input_key="q", label_key="a", limit=2)
    assert dataset.prompts == ["a", "b"]


def test_invalid_json_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "label": 1}\n\n{"prompt": "b", "label": \n')
    with pytest.raises(DatasetError, match=r"d\.jsonl, line 3: invalid JSON") as caught:
        EvalDataset.from_jsonl(path)
    assert (caught.value.path, caught.value.line) == (str(path), 3)
    assert isinstance(caught.value, ConfigError)


def test_a_missing_key_names_the_line_the_key_and_the_setting_to_change(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "label": 1},
                                               {"prompt": "b", "answer": 2}])
    message = r"line 2: label: missing from the record .*answer.*set label_key"
    with pytest.raises(DatasetError, match=message) as caught:
        EvalDataset.from_jsonl(path)
    assert (caught.value.line, caught.value.key) == (2, "label")


def test_a_prompt_that_is_not_a_string_is_refused(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": {"role": "user"}, "label": 1}])
    with pytest.raises(DatasetError, match=r"line 1: prompt: expected a non-empty string or a "
                                           r"list of chat messages, got an object"):
        EvalDataset.from_jsonl(path)


def test_an_unknown_scorer_is_refused_with_the_allowed_ones(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "label": 1}])
    with pytest.raises(DatasetError, match=r"unknown scorer 'fuzzy'; expected one of exact") as caught:
        EvalDataset.from_jsonl(path, scorer="fuzzy")
    assert caught.value.key == "scorer"


def test_labels_the_scorer_cannot_use_fail_at_construction(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "label": "B"},
                                               {"prompt": "b", "label": "seven"}])
    EvalDataset.from_jsonl(path, scorer="exact")
    with pytest.raises(DatasetError, match=r"line 1: label: 'B' cannot be scored 'numeric'"):
        EvalDataset.from_jsonl(path, scorer="numeric")
    with pytest.raises(DatasetError, match=r"line 2: label: 'seven' cannot be scored 'choice'"):
        EvalDataset.from_jsonl(path, scorer="choice")


@pytest.mark.parametrize(
    ("setting", "value"),
    [("n_samples", 0), ("max_tokens", 1.5), ("temperature", -1.0), ("top_p", 0.0),
     ("limit", 0), ("stop", [""])],
)
def test_bad_settings_name_the_setting(tmp_path: Path, setting: str, value: object) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "label": 1}])
    with pytest.raises(DatasetError, match=setting) as caught:
        EvalDataset.from_jsonl(path, **{setting: value})  # type: ignore[arg-type]
    assert caught.value.key == setting


def test_missing_and_empty_files_are_clear(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such file"):
        EvalDataset.from_jsonl(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="has no records"):
        EvalDataset.from_jsonl(tmp_path / "empty.jsonl")


def test_fingerprint_changes_with_records_and_settings(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "label": 1}])
    same = EvalDataset.from_jsonl(path).fingerprint()
    assert EvalDataset.from_jsonl(path).fingerprint() == same
    assert EvalDataset.from_jsonl(path, n_samples=2).fingerprint() != same
    write_jsonl(path, [{"prompt": "a", "label": 2}])
    assert EvalDataset.from_jsonl(path).fingerprint() != same


def test_eval_config_resolves_paths_against_the_file_and_layers_defaults(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "math.jsonl", [{"question": "1+1", "answer": "2"}])
    write_jsonl(data / "mc.jsonl", [{"prompt": "pick", "label": "C"}])
    config = tmp_path / "conf" / "eval.yaml"
    config.parent.mkdir()
    config.write_text(
        "defaults:\n"
        "  n_samples_per_eval_prompt: 4\n"
        "  temperature: 0.7\n"
        "datasets:\n"
        "  - name: math\n"
        "    path: ../data/math.jsonl\n"
        "    input_key: question\n"
        "    label_key: answer\n"
        "    rm_type: math\n"
        "    max_response_len: 64\n"
        "  - name: mc\n"
        "    path: ../data/mc.jsonl\n"
        "    scorer: gpqa\n"
        "    n_samples: 1\n"
    )
    math, mc = load_eval_config(config, defaults={"top_p": 0.9, "temperature": 0.1})
    assert (math.name, math.scorer, math.n_samples, math.max_tokens) == ("math", "math", 4, 64)
    assert (math.temperature, math.top_p) == (0.7, 0.9)
    assert (mc.scorer, mc.n_samples, mc.prompts) == ("gpqa", 1, ["pick"])


def test_eval_config_may_sit_under_an_eval_key(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "label": "1"}])
    (tmp_path / "e.yaml").write_text("eval:\n  datasets:\n    - {name: d, path: d.jsonl}\n")
    assert [d.name for d in load_eval_config(tmp_path / "e.yaml")] == ["d"]


@pytest.mark.parametrize(
    ("text", "line", "key", "message"),
    [
        ("datasets:\n  - name: d\n    path: d.jsonl\n    temprature: 1\n", 4, "temprature",
         "unknown dataset setting"),
        ("datasets:\n  - name: d\n", 2, "path", "needs a path"),
        ("datasets:\n  - name: d\n    path: d.jsonl\n    scorer: fuzzy\n", 4, "scorer",
         "unknown scorer 'fuzzy'"),
        ("datasets:\n  - name: d\n    path: nowhere.jsonl\n", 2, None, "no such file"),
        ("defaults: {n_samples: 0}\ndatasets:\n  - {name: d, path: d.jsonl}\n", 3, "n_samples",
         "expected an integer >= 1"),
        ("datasets: [\n", 2, None, "invalid YAML"),
        ("dataset:\n  - {name: d, path: d.jsonl}\n", 1, "dataset", "unknown top-level key"),
        ("datasets:\n  - {name: d, path: d.jsonl}\n  - {name: d, path: d.jsonl}\n", 3, "name",
         "appears twice"),
    ],
)
def test_bad_eval_configs_name_the_file_the_line_and_the_key(
    tmp_path: Path, text: str, line: int, key: str | None, message: str
) -> None:
    write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "label": "1"}])
    config = tmp_path / "eval.yaml"
    config.write_text(text)
    with pytest.raises(DatasetError, match=message) as caught:
        load_eval_config(config)
    assert (caught.value.path, caught.value.line, caught.value.key) == (str(config), line, key)


def test_a_bad_data_file_in_an_eval_config_names_the_data_file_and_its_line(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text('{"prompt": "a", "label": "1"}\n{"prompt": "b"}\n')
    (tmp_path / "eval.yaml").write_text("datasets:\n  - {name: d, path: d.jsonl}\n")
    with pytest.raises(DatasetError, match=r"d\.jsonl, line 2: label: missing") as caught:
        load_eval_config(tmp_path / "eval.yaml")
    assert caught.value.path == str(tmp_path / "d.jsonl")

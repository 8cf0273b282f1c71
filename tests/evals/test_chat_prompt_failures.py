"""Chat prompts prepared in the trainer's process from a snapshot whose template is hostile
(:data:`tests.chat_models.HOSTILE_TEMPLATE`): every way it fails is a refused record naming the
problem, counted in ``eval/<name>/errors``, never a thread that spins; a template that loops
costs one render deadline per dataset, not one per record. And a dataset whose
``chat_template_kwargs`` carries an argument of ``apply_chat_template`` (a ``chat_template``
would replace the snapshot's) is a :class:`DatasetError` naming the key, from Python and from
``--eval-config``."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from actorsys.evals import DatasetError, EvalDataset, load_eval_config
from actorsys.evals.data.prompts import prepare_prompts
from actorsys.evals.harnesses.sampling import evaluate_datasets
from actorsys.fleet._render.pool import RENDER_TIMEOUT
from actorsys.fleet.clients.completions import Completion
from tests.chat_models import HOSTILE_TEMPLATE, make_tool_chat_model, with_chat_template


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    return with_chat_template(make_tool_chat_model(root / "base"), root / "hostile",
                              HOSTILE_TEMPLATE)


def chat_dataset(*contents: str, name: str = "h") -> EvalDataset:
    records = tuple({"messages": [{"role": "user", "content": c}], "label": "x"}
                    for c in contents)
    return EvalDataset(name=name, records=records, input_key="messages",
                       apply_chat_template=True, max_tokens=2)


class AnswersX:
    """A pinned fleet that answers every prompt it is sent with ``x``."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def complete(self, prompts: Sequence[Any], **settings: Any) -> list[Completion]:
        await trio.lowlevel.checkpoint()
        self.sent.extend(prompts)
        return [Completion(i, p, "x", "stop", "1", "fake://") for i, p in enumerate(prompts)]


@pytest.mark.parametrize(
    "key", ["chat_template", "tokenize", "return_dict", "continue_final_message", "documents"]
)
def test_a_dataset_whose_template_kwargs_carry_an_argument_of_apply_chat_template_is_refused(
    tmp_path: Path, key: str
) -> None:
    records = ({"messages": [{"role": "user", "content": "hi"}], "label": "x"},)
    with pytest.raises(DatasetError) as python:
        EvalDataset(name="d", records=records, input_key="messages", apply_chat_template=True,
                    chat_template_kwargs={key: "{{ 'another template' }}"})
    assert python.value.key == f"chat_template_kwargs.{key}"
    assert "apply_chat_template" in str(python.value)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(records[0]) + "\n")
    config = tmp_path / "eval.yaml"
    config.write_text(f"datasets:\n  - name: d\n    path: {data}\n    input_key: messages\n"
                      f"    apply_chat_template: true\n"
                      f"    apply_chat_template_kwargs: {{{key}: x, enable_thinking: false}}\n")
    with pytest.raises(DatasetError) as yaml:
        load_eval_config(config)
    assert yaml.value.key == f"chat_template_kwargs.{key}"
    EvalDataset(name="d", records=records, input_key="messages", apply_chat_template=True,
                chat_template_kwargs={"enable_thinking": False})


@pytest.mark.timeout(180)
def test_a_failing_template_refuses_its_records_naming_the_problem(hostile: Path) -> None:
    dataset = chat_dataset("hi", "recursion", "range", "huge", "long", "hello")
    [prompts] = prepare_prompts(str(hostile), [dataset])
    assert [sent is None for sent in prompts.sent] == [False, True, True, True, True, False]
    refusals = [r or "" for r in prompts.refusals]
    assert refusals[0] == refusals[5] == ""
    assert "recursed or nested too deeply" in refusals[1]
    assert "Range too big" in refusals[2]
    assert "more memory than a render may take" in refusals[3]
    assert "rendered text is too long" in refusals[4]
    assert all(str(hostile) in r for r in refusals[1:5])


@pytest.mark.timeout(180)
async def test_a_looping_template_costs_one_deadline_and_its_records_count_as_errors(
    hostile: Path,
) -> None:
    fleet = AnswersX()
    dataset = chat_dataset("hi", "loop", "hello", "loop", "hey")
    started = time.monotonic()
    output = await evaluate_datasets(fleet, [dataset], concurrency=2, request_timeout=10.0,
                                     retries=0, checkpoint_dir=str(hostile))
    took = time.monotonic() - started
    assert RENDER_TIMEOUT - 1.0 <= took < RENDER_TIMEOUT + 20.0  # one deadline, not two
    assert (output.metrics or {})["eval/h/errors"] == 4.0
    assert len(fleet.sent) == 1  # only the record before the loop was rendered
    samples = (output.data or {})["samples"]["h"]
    assert f"deadline of {RENDER_TIMEOUT:g} s" in samples[1]["error"]
    assert "not rendered: the chat template overran on record 1" in samples[2]["error"]
    assert_no_render_worker_spins()


def render_workers() -> list[tuple[int, str]]:
    """The pid and status of each render worker of this process."""
    found = []
    for child in psutil.Process().children():
        try:
            if any(a.endswith(os.path.join("_render", "worker.py")) for a in child.cmdline()):
                found.append((child.pid, child.status()))
        except psutil.Error:  # it ended meanwhile
            pass
    return found


def assert_no_render_worker_spins() -> None:
    """No render worker of this process keeps running: the one that looped was killed (its
    replacement's start takes a few seconds of imports, so this waits on the wall clock)."""
    deadline = time.monotonic() + 60.0
    while True:
        spinning = [pid for pid, status in render_workers() if status == psutil.STATUS_RUNNING]
        if not spinning:
            return
        assert time.monotonic() < deadline, f"render workers still running: {spinning}"
        time.sleep(0.2)

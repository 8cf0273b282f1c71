from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from actorsys.evals import EvalDataset
from tests.fleet.conftest import (  # noqa: F401 - the shared tiny-model and vLLM fixtures
    TinyModels,
    tied,
    tiny,
    tiny_vllm,
    vllm_servers,
)
from tests.models import PROMPTS, greedy

MAX_TOKENS = 6


@dataclass(frozen=True)
class Answers:
    """A dataset whose labels are what step1 answers on the first prompts and step2 on the
    last, with the score each snapshot must get (from transformers' own greedy answers)."""

    path: Path
    expected: dict[str, float]

    def dataset(self, **settings: object) -> EvalDataset:
        return EvalDataset.from_jsonl(self.path, max_tokens=MAX_TOKENS, **settings)  # type: ignore[arg-type]


def label_file(models: TinyModels, directory: Path) -> Answers:
    by_snapshot = {
        name: greedy(getattr(models, name), PROMPTS, MAX_TOKENS) for name in ("base", "step1", "step2")
    }
    labels = [*by_snapshot["step1"][:3], by_snapshot["step2"][3]]
    path = directory / "answers.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "label": label}) + "\n"
                            for p, label in zip(PROMPTS, labels, strict=True)))
    expected = {
        name: sum(a.strip() == label.strip() for a, label in zip(got, labels, strict=True)) / 4
        for name, got in by_snapshot.items()
    }
    assert expected["step1"] != expected["step2"], "the snapshots must answer differently"
    return Answers(path, expected)


@pytest.fixture(scope="session")
def tied_answers(tied: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Answers:  # noqa: F811
    return label_file(tied, tmp_path_factory.mktemp("tied-answers"))


@pytest.fixture(scope="session")
def answers(tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Answers:  # noqa: F811
    return label_file(tiny, tmp_path_factory.mktemp("answers"))


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it now."""
    try:
        return [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return [pid]


def running(pids: list[int]) -> list[int]:
    """Those of ``pids`` that still run (a zombie waiting to be reaped does not)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@dataclass(frozen=True)
class ChatSet:
    """The tiny chat model, and a dataset of its conversations in two flavours (thinking on,
    and off through ``enable_thinking``) whose labels are transformers' own greedy answers
    from ``apply_chat_template(..., tokenize=True)``, and the answers to the same prompts with
    a second BOS in front."""

    model: Path
    path: Path
    expected: dict[str, list[str]]
    double_bos: dict[str, list[str]]

    def datasets(self, **settings: object) -> list[EvalDataset]:
        return [
            EvalDataset.from_jsonl(self.path, name="thinking", input_key="messages",
                                   label_key="thinking", tool_key="tools",
                                   apply_chat_template=True, max_tokens=CHAT_TOKENS,
                                   **settings),  # type: ignore[arg-type]
            EvalDataset.from_jsonl(self.path, name="direct", input_key="messages",
                                   label_key="direct", tool_key="tools",
                                   apply_chat_template=True, max_tokens=CHAT_TOKENS,
                                   chat_template_kwargs={"enable_thinking": False},
                                   **settings),  # type: ignore[arg-type]
        ]


CHAT_TOKENS = 8


@pytest.fixture(scope="session")
def chat_set(tmp_path_factory: pytest.TempPathFactory) -> ChatSet:
    from transformers import PreTrainedTokenizerFast

    from tests.chat_models import CONVERSATIONS, greedy_ids, make_chat_model, template_ids

    root = tmp_path_factory.mktemp("chat")
    model = make_chat_model(root / "model", seed=7)
    bos = PreTrainedTokenizerFast.from_pretrained(model).bos_token_id
    flavours = {"thinking": {}, "direct": {"enable_thinking": False}}
    prompts = {name: [template_ids(model, c, **kwargs) for c in CONVERSATIONS]
               for name, kwargs in flavours.items()}
    assert all(ids[0] == bos and ids[1] != bos for ids in prompts["direct"])
    expected = {name: greedy_ids(model, ids, CHAT_TOKENS) for name, ids in prompts.items()}
    doubled = {name: greedy_ids(model, [[bos, *p] for p in ids], CHAT_TOKENS)
               for name, ids in prompts.items()}
    path = root / "chat.jsonl"
    path.write_text("".join(
        json.dumps({**c, "thinking": expected["thinking"][i], "direct": expected["direct"][i]}) + "\n"
        for i, c in enumerate(CONVERSATIONS)
    ))
    return ChatSet(model, path, expected, doubled)

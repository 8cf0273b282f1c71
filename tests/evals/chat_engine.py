"""A real CPU engine process serving the tiny chat model, shared by a test module."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from actorsys import Fleet, SGLangEngine
from tests.chat_models import make_tool_chat_model
from tests.engine_process import engine_process


@dataclass(frozen=True)
class ChatEngine:
    """An engine at ``url`` answering to ``key``, serving ``base``; ``snapshots`` of its
    architecture and tokenizer (other weights) by step."""

    url: str
    key: str | None
    base: Path
    snapshots: dict[int, Path]

    def fleet(self) -> Fleet:
        return Fleet([SGLangEngine(self.url, api_key=self.key)])


@contextmanager
def chat_engine(root: Path, *, key: str | None, steps: tuple[int, ...] = (1, 2)) -> Iterator[ChatEngine]:
    base = make_tool_chat_model(root / "base", seed=0)
    snapshots = {step: make_tool_chat_model(root / f"step{step}", seed=step) for step in steps}
    with engine_process(["--model", str(base)], key=key) as url:
        yield ChatEngine(url, key, base, snapshots)

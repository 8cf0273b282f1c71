"""A real CPU engine process serving a snapshot whose chat template is hostile
(:data:`tests.chat_models.HOSTILE_TEMPLATE`): each way a template can go wrong (a loop for
about ever, a string of a GB, endless recursion, a range past the sandbox's, too much text,
tools nested too deeply) is a 400 naming the problem, within the render deadline; the engine's
memory stays its own and every other route answers after; ``chat_template_kwargs`` cannot
replace the template."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from actorsys.fleet._render.pool import RENDER_TIMEOUT
from tests.chat_models import HOSTILE_TEMPLATE, make_tool_chat_model, with_chat_template
from tests.engine_process import engine_process

# One engine process for the module: its tests share one worker.
pytestmark = pytest.mark.xdist_group("fleet/test_engine_templates")

ANSWER_SECONDS = 8.0
"""How long the engine may take to answer a request after a hostile one (a busy machine)."""


@dataclass(frozen=True)
class Served:
    url: str
    pid: int
    snapshot: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("hostile")
    snapshot = with_chat_template(make_tool_chat_model(root / "base"), root / "hostile",
                                  HOSTILE_TEMPLATE)
    processes: list[subprocess.Popen[bytes]] = []
    with engine_process(["--model", str(snapshot)], processes=processes) as url:
        yield Served(url, processes[0].pid, snapshot)


def chat(served: Served, content: str, timeout: float = 60.0, **body: Any) -> httpx.Response:
    return httpx.post(f"{served.url}/v1/chat/completions", timeout=timeout, json={
        "messages": [{"role": "user", "content": content}], "max_tokens": 2, **body})


def message(response: httpx.Response) -> str:
    text: str = response.json()["error"]["message"]
    return text


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def assert_the_engine_answers(served: Served) -> None:
    completion = httpx.post(f"{served.url}/v1/completions", timeout=ANSWER_SECONDS,
                            json={"prompt": "the quick", "max_tokens": 2})
    assert completion.status_code == 200, completion.text
    load = httpx.post(f"{served.url}/update_weights_from_disk", timeout=ANSWER_SECONDS,
                      json={"model_path": str(served.snapshot), "weight_version": "again"})
    assert load.status_code == 200, load.text
    assert httpx.get(f"{served.url}/health", timeout=ANSWER_SECONDS).status_code == 200
    assert chat(served, "hi", timeout=ANSWER_SECONDS).status_code == 200


@pytest.mark.timeout(180)
def test_a_template_that_loops_is_a_400_at_its_deadline_and_the_engine_answers_after(
    served: Served,
) -> None:
    assert chat(served, "hi").status_code == 200
    started = time.monotonic()
    response = chat(served, "loop", timeout=RENDER_TIMEOUT + 30.0)
    took = time.monotonic() - started
    assert response.status_code == 400, response.text
    assert message(response).startswith("messages: ")
    assert f"deadline of {RENDER_TIMEOUT:g} s" in message(response)
    assert RENDER_TIMEOUT - 1.0 <= took < RENDER_TIMEOUT + 15.0
    assert_the_engine_answers(served)


@pytest.mark.timeout(180)
def test_a_template_building_a_gigabyte_is_a_400_and_the_engine_memory_stays_its_own(
    served: Served,
) -> None:
    before = peak_rss_mib(served.pid)
    response = chat(served, "huge")
    assert response.status_code == 400, response.text
    assert "more memory than a render may take" in message(response)
    assert peak_rss_mib(served.pid) - before < 200, (before, peak_rss_mib(served.pid))
    assert_the_engine_answers(served)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("content", "problem"), [
    ("recursion", "recursed or nested too deeply"),
    ("range", "Range too big"),
    ("long", "rendered text is too long"),
])
def test_a_template_that_recurses_or_overreaches_is_a_400_naming_the_problem(
    served: Served, content: str, problem: str
) -> None:
    response = chat(served, content)
    assert response.status_code == 400, response.text
    assert message(response).startswith("messages: ")
    assert problem in message(response)
    assert chat(served, "hi", timeout=ANSWER_SECONDS).status_code == 200


@pytest.mark.timeout(180)
def test_tools_nested_too_deeply_for_the_template_are_a_400(served: Served) -> None:
    nested: dict[str, Any] = {}
    inner = nested
    for _ in range(800):
        inner["a"] = {}
        inner = inner["a"]
    tool = {"type": "function", "function": {"name": "f", "parameters": nested}}
    response = chat(served, "hi", tools=[tool])
    assert response.status_code == 400, response.text
    assert "nest" in message(response) or "recursed" in message(response)


@pytest.mark.timeout(180)
def test_chat_template_kwargs_cannot_replace_the_template(served: Served) -> None:
    for key in ("chat_template", "tokenize", "return_dict", "tools"):
        response = chat(served, "hi", chat_template_kwargs={key: "{{ 'another template' }}"})
        assert response.status_code == 400, response.text
        assert message(response).startswith(f"chat_template_kwargs.{key}: ")
    thinking = chat(served, "hi", chat_template_kwargs={"enable_thinking": False})
    assert thinking.status_code == 200, thinking.text

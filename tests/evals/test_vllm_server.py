"""ServerEvalFn on a real vLLM server (the vLLM tier, from .venv-vllm): each snapshot scored
exactly as transformers answers it, with tied embeddings on a server it launches (which
vLLM's own reload gets wrong; the launch gives it actorsys' worker extension) and untied ones
on a server it attaches to, a corrupt one refused before vLLM sees it, no process left after
dispose of a launched server and an attached one left running. Skipped when .venv-vllm is
missing."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from actorsys import EvalConfig, EvalSupervisor, MemorySink
from actorsys.evals import ServerEvalFn
from actorsys.fleet import CheckpointRejectedError
from actorsys.fleet.checkpoint import read_tensor_infos
from tests.evals.conftest import Answers, process_tree, running
from tests.fleet.conftest import VLLM_PYTHON, VLLM_TIER, TinyModels, corrupt_copy
from tests.fleet.vllm_server import SharedVLLM

pytestmark = VLLM_TIER


def vllm_argv(model: Path) -> list[str]:
    return [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--host", "127.0.0.1", "--port", "{port}", "--dtype", "float32", "--max-model-len", "512",
        "--enforce-eager", "--kv-cache-memory-bytes", str(64 * 1024 * 1024),
    ]


async def score(
    evaluation: ServerEvalFn, tiny: TinyModels, tmp_path: Path
) -> tuple[MemorySink, list[int]]:
    """Steps 1, 2 and 4 on step1, step2 and step1 again, step 3 on a corrupt copy of step2;
    the points and, for a launched server, its process tree while the supervisor was open."""
    corrupt = corrupt_copy(tiny.step2, tmp_path / "corrupt")
    sink = MemorySink()
    config = EvalConfig(hf_dir=tmp_path / "staging", base_checkpoint=tiny.base,
                        eval_timeout=500.0, close_timeout=10.0)
    async with EvalSupervisor.open(config, eval_fn=evaluation, sink=sink) as sup:
        for step, snapshot in ((1, tiny.step1), (2, tiny.step2), (3, corrupt), (4, tiny.step1)):
            await sup.submit(step, checkpoint_dir=snapshot)
        assert (await sup.drain(timeout=560)).pending == []
        process = evaluation.process
        tree = [] if process is None else process_tree(process.pid)
    return sink, tree


def assert_scored(sink: MemorySink, answers: Answers) -> None:
    outcomes = sink.by_step()
    for step, name in ((1, "step1"), (2, "step2"), (4, "step1")):
        assert outcomes[step].status == "ok", (step, outcomes[step].reason)
        assert outcomes[step].metrics["eval/answers"] == answers.expected[name]
    assert (outcomes[3].status, outcomes[3].reason) == ("skipped", CheckpointRejectedError.reason)


@pytest.mark.timeout(600)
async def test_launched_vllm_server_scores_each_tied_snapshot_and_refuses_a_corrupt_one(
    tied: TinyModels, tied_answers: Answers, tmp_path: Path
) -> None:
    assert "lm_head.weight" not in read_tensor_infos(str(tied.step1))
    evaluation = ServerEvalFn(tied_answers.dataset(), launch=vllm_argv(tied.base),
                              ready_timeout=400.0, request_timeout=60.0, pin_timeout=120.0)
    assert evaluation.tied_reload
    try:
        sink, tree = await score(evaluation, tied, tmp_path)
    finally:
        await evaluation.dispose()
    assert_scored(sink, tied_answers)
    assert len(tree) >= 3  # the reaper, the API server, its engine core
    assert evaluation.process is None  # the supervisor disposed of it at close
    assert running(tree) == []


@pytest.mark.timeout(600)
async def test_attached_vllm_server_scores_each_untied_snapshot_and_is_left_running(
    tiny: TinyModels, answers: Answers, tiny_vllm: SharedVLLM, tmp_path: Path
) -> None:
    assert "lm_head.weight" in read_tensor_infos(str(tiny.step1))
    evaluation = ServerEvalFn(answers.dataset(), url=tiny_vllm.url, api_key=tiny_vllm.api_key,
                              request_timeout=60.0, pin_timeout=120.0)
    assert not evaluation.tied_reload  # vLLM's own reload, exact for untied embeddings
    try:
        sink, tree = await score(evaluation, tiny, tmp_path)
    finally:
        await evaluation.dispose()
    assert_scored(sink, answers)
    assert tree == []
    async with httpx.AsyncClient(timeout=30.0) as client:
        assert (await client.get(f"{tiny_vllm.url}/health")).status_code == 200

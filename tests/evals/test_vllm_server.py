"""ServerEvalFn launching a real vLLM server (the vLLM tier, from .venv-vllm): each snapshot
scored exactly as transformers answers it, with untied and tied embeddings (which vLLM's own
reload gets wrong), a corrupt one refused before vLLM sees it, and no process left after
dispose. Skipped when .venv-vllm is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from actorsys import EvalConfig, EvalSupervisor, MemorySink
from actorsys.evals import ServerEvalFn
from actorsys.fleet import CheckpointRejectedError
from actorsys.fleet.checkpoint import read_tensor_infos
from tests.evals.conftest import Answers, process_tree, running
from tests.fleet.conftest import VLLM_PYTHON, VLLM_TIER, TinyModels, corrupt_copy

pytestmark = VLLM_TIER


def vllm_argv(model: Path) -> list[str]:
    return [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--host", "127.0.0.1", "--port", "{port}", "--dtype", "float32", "--max-model-len", "512",
        "--enforce-eager", "--kv-cache-memory-bytes", str(64 * 1024 * 1024),
    ]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("embeddings", ["untied", "tied"])
async def test_launched_vllm_server_scores_each_snapshot_and_refuses_a_corrupt_one(
    embeddings: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    tiny: TinyModels = request.getfixturevalue("tiny" if embeddings == "untied" else "tied")
    answers: Answers = request.getfixturevalue(
        "answers" if embeddings == "untied" else "tied_answers"
    )
    has_head = "lm_head.weight" in read_tensor_infos(str(tiny.step1))
    assert has_head == (embeddings == "untied")
    corrupt = corrupt_copy(tiny.step2, tmp_path / "corrupt")
    evaluation = ServerEvalFn(answers.dataset(), launch=vllm_argv(tiny.base), ready_timeout=400.0,
                              request_timeout=60.0, pin_timeout=120.0)
    assert evaluation.tied_reload
    sink = MemorySink()
    config = EvalConfig(hf_dir=tmp_path / "staging", base_checkpoint=tiny.base,
                        eval_timeout=500.0, close_timeout=10.0)
    try:
        async with EvalSupervisor.open(config, eval_fn=evaluation, sink=sink) as sup:
            for step, snapshot in ((1, tiny.step1), (2, tiny.step2), (3, corrupt), (4, tiny.step1)):
                await sup.submit(step, checkpoint_dir=snapshot)
            assert (await sup.drain(timeout=560)).pending == []
            process = evaluation.process
            assert process is not None
            tree = process_tree(process.pid)
    finally:
        await evaluation.dispose()
    outcomes = sink.by_step()
    for step, name in ((1, "step1"), (2, "step2"), (4, "step1")):
        assert outcomes[step].status == "ok", (step, outcomes[step].reason)
        assert outcomes[step].metrics["eval/answers"] == answers.expected[name]
    assert (outcomes[3].status, outcomes[3].reason) == ("skipped", CheckpointRejectedError.reason)
    assert len(tree) >= 3  # the reaper, the API server, its engine core
    assert evaluation.process is None  # the supervisor disposed of it at close
    assert running(tree) == []

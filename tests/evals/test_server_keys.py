"""A server ServerEvalFn launches listens on loopback only and requires a key, whatever its
argv says; the evaluation reaches it with that key."""

from __future__ import annotations

import sys

import httpx
import psutil
import pytest

from actorsys import RolloutFnEvalInput
from actorsys.evals import ServerEvalFn
from tests.evals.conftest import Answers
from tests.fleet.conftest import TinyModels


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_launched_server_listens_on_loopback_with_a_key_even_if_told_otherwise(
    tiny: TinyModels, answers: Answers
) -> None:
    argv = [sys.executable, "-m", "actorsys", "engine", "--model", str(tiny.base),
            "--host", "0.0.0.0", "--port", "{port}"]
    evaluation = ServerEvalFn(answers.dataset(), launch=argv, ready_timeout=120.0, grace=2.0)
    try:
        output = await evaluation.evaluate_checkpoint(
            str(tiny.step1), RolloutFnEvalInput(rollout_id=1, hf_dir=str(tiny.step1))
        )
        assert output.metrics is not None
        assert output.metrics["eval/answers"] == answers.expected["step1"]
        assert evaluation.process is not None and evaluation.url is not None
        pid = evaluation.process.command_pid()
        assert pid is not None
        listening = {c.laddr.ip for c in psutil.Process(pid).net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN}
        assert listening == {"127.0.0.1"}
        assert evaluation.api_key
        async with httpx.AsyncClient(base_url=evaluation.url, timeout=10.0) as client:
            load = {"model_path": str(tiny.step2), "weight_version": "1"}
            assert (await client.post("/update_weights_from_disk", json=load)).status_code == 401
            assert (await client.get("/health")).status_code == 200
    finally:
        await evaluation.dispose()

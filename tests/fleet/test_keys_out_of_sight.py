"""Keys stay out of command lines and reprs wherever actorsys puts them; where a user puts one
on a command line, the help says who can read it."""

from __future__ import annotations

import sys

import httpx
import psutil
import pytest

from actorsys.cli import build_parser
from actorsys.evals import EvalDataset, ServerEvalFn
from actorsys.fleet.clients.sglang import SGLangEngine
from actorsys.fleet.external import ExternalServer
from tests.fleet.conftest import TinyModels


def test_watch_help_says_a_key_on_the_command_line_is_visible(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["watch", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "visible to every local user" in help_text
    assert "ACTORSYS_API_KEY" in help_text


@pytest.mark.parametrize("argv_key", [["--api-key", "s3cret"], ["--api-key=s3cret"]])
def test_a_users_key_in_a_launch_argv_leaves_the_argv_and_the_repr(argv_key: list[str]) -> None:
    argv = [sys.executable, "-m", "actorsys", "engine", "--model", "m", "--port", "{port}",
            *argv_key]
    server = ExternalServer(url=None, launch=argv, flavor="sglang", ready_timeout=1.0,
                            grace=1.0, make_engine=lambda flavor, url: SGLangEngine(url))
    assert "s3cret" not in repr(server)
    assert server.launch is not None and "s3cret" not in " ".join(server.launch)
    assert "--api-key" not in " ".join(server.launch)


def test_server_eval_fn_repr_hides_the_argv_key() -> None:
    dataset = EvalDataset(name="d", records=[{"prompt": "p", "label": "1"}])
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--port", "{port}",
            "--api-key", "s3cret"]
    evaluation = ServerEvalFn([dataset], launch=argv)
    assert "s3cret" not in repr(evaluation)
    assert evaluation.launch is not None and "s3cret" not in " ".join(evaluation.launch)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_launched_engine_requires_the_argv_key_from_its_environment(
    tiny: TinyModels,
) -> None:
    argv = [sys.executable, "-m", "actorsys", "engine", "--model", str(tiny.base),
            "--port", "{port}", "--api-key", "s3cret"]
    server = ExternalServer(url=None, launch=argv, flavor="sglang", ready_timeout=120.0,
                            grace=2.0,
                            make_engine=lambda flavor, url: SGLangEngine(url, api_key="s3cret"))
    try:
        await server.fleet()
        assert server.process is not None and server.url is not None
        pid = server.process.command_pid()
        assert pid is not None
        assert "s3cret" not in " ".join(psutil.Process(pid).cmdline())
        async with httpx.AsyncClient(base_url=server.url, timeout=10.0) as client:
            assert (await client.get("/v1/models")).status_code == 401
            keyed = await client.get("/v1/models", headers={"authorization": "Bearer s3cret"})
            assert keyed.status_code == 200
    finally:
        await server.stop()

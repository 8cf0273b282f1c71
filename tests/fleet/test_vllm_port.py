"""The vLLM tier of the port-squat hardening: a local fleet's vLLM server serves the socket the
fleet bound (``actorsys_vllm_serve --listen-fd``), so its port is never free, also while the
server is restarted. Skipped when .venv-vllm is missing."""

from __future__ import annotations

import errno
import signal
import socket

import httpx
import psutil
import pytest
import trio

from actorsys.fleet.local import LocalFleet, vllm
from tests.fleet.conftest import VLLM_PYTHON, VLLM_TIER, TinyModels

pytestmark = VLLM_TIER


@pytest.mark.timeout(600)
async def test_a_vllm_server_serves_the_fleets_socket_and_its_restart_never_frees_the_port(
    tiny: TinyModels,
) -> None:
    spec = vllm(str(tiny.base), python=str(VLLM_PYTHON))
    async with LocalFleet.open([spec], startup_timeout=400) as local:
        engine = local.engines[0]
        pid = engine.process.command_pid()
        assert pid is not None
        command = psutil.Process(pid).cmdline()
        assert "actorsys_vllm_serve" in command and "--listen-fd" in command
        engine.process.signal_group(signal.SIGKILL)
        await engine.process.wait()
        with socket.socket() as squatter:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with pytest.raises(OSError, match="in use") as taken:
                squatter.bind(("127.0.0.1", engine.port))
        assert taken.value.errno == errno.EADDRINUSE
        with trio.fail_after(400):
            await engine.wait_state("running", restarts=1)
        async with httpx.AsyncClient(timeout=30.0) as client:
            keyed = await client.get(f"{engine.url}/v1/models",
                                     headers={"authorization": f"Bearer {local.api_key}"})
            assert keyed.status_code == 200

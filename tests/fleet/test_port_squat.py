"""No local user can take a server's port, and with it the fleet's key: engines serve a socket
the fleet bound before anyone could see its port (and kept across restarts); a server that
binds its own port (the router, a launched one) gets nothing, ``/health`` included, before
its own processes are proven to hold the listener. A stand-in that binds first plays the
squatter: it answers every request 200 and records what it was sent."""

from __future__ import annotations

import os
import signal
import sys

import httpx
import pytest
import trio
import trio.testing

from actorsys.fleet._proc.port import held_listener, owns_port
from actorsys.fleet.clients.sglang import SGLangEngine
from actorsys.fleet.external import ExternalServer
from actorsys.fleet.local import FleetStartError, LocalFleet, embedded
from actorsys.fleet.local import start as local_start
from actorsys.fleet.on_all import EngineUnhealthyError
from tests.fleet.conftest import TinyModels, kill_and_see_the_port_held


class StandIn:
    """A squatter on a port of 127.0.0.1: answers 200 to anything, records the requests."""

    def __init__(self) -> None:
        self.sock = held_listener()
        self.port = int(self.sock.getsockname()[1])
        self.requests: list[bytes] = []

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(self.sock))
        task_status.started()
        await trio.serve_listeners(self._answer, [listener])

    async def _answer(self, stream: trio.SocketStream) -> None:
        data = b""
        with trio.move_on_after(5):
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                data += chunk
        self.requests.append(data)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n"
                              b"\r\n{}")
        await stream.aclose()


@pytest.fixture
async def stand_in(nursery: trio.Nursery) -> StandIn:
    squatter = StandIn()
    await nursery.start(squatter.serve)
    return squatter


def test_a_port_is_owned_only_by_the_group_that_listens_on_it() -> None:
    sock = held_listener()
    port = int(sock.getsockname()[1])
    try:
        assert owns_port(os.getpgid(0), port)
        assert not owns_port(os.getpgid(0) + 1_000_000, port)
    finally:
        sock.close()
    assert not owns_port(os.getpgid(0), port)  # nothing listens any more


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_engines_serve_the_fleets_socket_and_a_restart_never_frees_the_port(
    tiny: TinyModels, stand_in: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The old way handed out a free port by number: give it the squatter's.
    monkeypatch.setattr(local_start, "free_port", lambda: stand_in.port)
    async with LocalFleet.open([embedded(str(tiny.base))], startup_timeout=120.0) as local:
        engine = local.engines[0]
        assert engine.port != stand_in.port
        await kill_and_see_the_port_held(engine, 120)
        await engine.client.health()
        async with httpx.AsyncClient(timeout=30.0) as client:
            keyed = await client.get(f"{engine.url}/v1/models",
                                     headers={"authorization": f"Bearer {local.api_key}"})
            assert keyed.status_code == 200
    assert stand_in.requests == []


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_router_whose_port_was_taken_gets_nothing_sent_and_the_fleet_fails_to_start(
    tiny: TinyModels, stand_in: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_start, "free_port", lambda: stand_in.port)
    with pytest.raises(FleetStartError, match="router exited"):
        async with LocalFleet.open([embedded(str(tiny.base))], router=True,
                                   startup_timeout=120.0):
            pass
    assert stand_in.requests == []


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_launched_server_whose_port_was_taken_is_sent_no_key(
    tiny: TinyModels, stand_in: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    from actorsys.fleet.external import server as external

    monkeypatch.setattr(external, "free_port", lambda: stand_in.port)
    argv = [sys.executable, "-m", "actorsys", "engine", "--model", str(tiny.base),
            "--port", "{port}", "--api-key", "user-secret"]
    server = ExternalServer(
        url=None, launch=argv, flavor="sglang", ready_timeout=120.0, grace=2.0,
        make_engine=lambda flavor, url: SGLangEngine(url, api_key=server.api_key),
    )
    assert "user-secret" not in repr(server) and "user-secret" not in str(server.launch)
    try:
        with pytest.raises(EngineUnhealthyError, match="exited"):
            await server.fleet()
    finally:
        await server.stop()
    assert stand_in.requests == []


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_router_that_exits_is_forgotten_so_nothing_goes_to_its_free_port(
    tiny: TinyModels,
) -> None:
    async with LocalFleet.open([embedded(str(tiny.base))], router=True,
                               startup_timeout=120.0) as local:
        assert local.router is not None and local.fleet.router_url is not None
        local.router.signal_group(signal.SIGKILL)
        with trio.fail_after(30):
            await local.router.wait()
            await trio.testing.wait_all_tasks_blocked()
        assert local.fleet.router_url is None and local.router_url is None
        assert local.fleet.base_url == local.engines[0].url
        await local.engines[0].client.health()

"""LocalFleet's process handling, with stub engines (a few lines of http.server) so that it
is fast: start, wait for health, cancellation, start failures."""

from __future__ import annotations

import sys

import psutil
import pytest
import trio

from actorsys import SGLangEngine
from actorsys.fleet.local import EngineSpec, FleetStartError, LocalFleet

pytestmark = pytest.mark.slow

STUB = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def stub(code: str = STUB) -> EngineSpec:
    return EngineSpec(
        kind="stub",
        command=lambda port: [sys.executable, "-c", code, str(port)],
        client=lambda url, name: SGLangEngine(url, name=name),
    )


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(60)
async def test_cancelling_the_owner_stops_every_engine() -> None:
    pids: list[int] = []
    with trio.CancelScope() as scope:
        async with LocalFleet.open([stub(), stub()], grace=2.0) as local:
            for engine in local.engines:
                await engine.client.health()
                pids += [engine.process.pid, engine.process.command_pid() or -1]
            scope.cancel()
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert len(pids) == 4
    assert not any(alive(pid) for pid in pids)


@pytest.mark.timeout(60)
async def test_engine_that_exits_at_start_fails_the_start_with_its_log() -> None:
    crash = "import sys; print('cannot bind', file=sys.stderr); sys.exit(3)"
    with pytest.raises(FleetStartError, match="exited with status 3") as caught:
        async with LocalFleet.open([stub(), stub(crash)], grace=2.0):
            pass
    assert "cannot bind" in str(caught.value)


@pytest.mark.timeout(60)
async def test_restart_brings_an_engine_back_on_its_port() -> None:
    async with LocalFleet.open([stub()], grace=2.0) as local:
        engine = local.engines[0]
        before = engine.process.pid
        await local.restart(0)
        assert engine.process.pid != before
        assert not alive(before)
        await engine.client.health()

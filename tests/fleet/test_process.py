"""Engine processes never outlive their owner: real processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest
import trio

from actorsys.fleet._proc.process import spawn

pytestmark = pytest.mark.slow

PARENT_WITH_CHILD = (
    "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"
)
IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def wait_for_tree(root: int, count: int) -> list[int]:
    """The pids below ``root`` once there are ``count`` of them (polled, bounded)."""
    with trio.fail_after(30):
        while True:
            try:
                pids = [p.pid for p in psutil.Process(root).children(recursive=True)]
            except psutil.NoSuchProcess:
                pids = []
            if len(pids) >= count:
                return pids
            await trio.sleep(0.05)


async def wait_gone(pids: list[int]) -> None:
    """Poll until none of ``pids`` runs: another process's exit has no event to wait on."""
    with trio.fail_after(30):
        while any(alive(pid) for pid in pids):  # noqa: ASYNC110
            await trio.sleep(0.05)


@pytest.mark.timeout(60)
async def test_stop_ends_the_command_and_everything_it_started() -> None:
    process = spawn("tree", [sys.executable, "-c", PARENT_WITH_CHILD], grace=5.0)
    pids = await wait_for_tree(process.pid, 2)
    with trio.fail_after(4.0):
        await process.stop(grace=5.0)
    assert process.returncode is not None
    # The group was sent SIGKILL before stop returned; the kernel ends its members moments
    # later, well inside the grace, which a stop no longer waits out.
    with trio.fail_after(2.0):
        await wait_gone([process.pid, *pids])


@pytest.mark.timeout(60)
async def test_command_that_ignores_sigterm_is_killed_after_the_grace_period() -> None:
    process = spawn("stubborn", [sys.executable, "-c", IGNORES_SIGTERM], grace=1.0)
    (command,) = await wait_for_tree(process.pid, 1)
    await process.stop(grace=1.0)
    assert not alive(command)


@pytest.mark.timeout(60)
async def test_command_that_dies_is_reported_and_its_pid_is_known() -> None:
    process = spawn("crasher", [sys.executable, "-c", "import time; time.sleep(300)"], grace=1.0)
    (command,) = await wait_for_tree(process.pid, 1)
    assert process.command_pid() == command
    os.kill(command, signal.SIGKILL)
    with trio.fail_after(30):
        status = await process.wait()
    assert status == 128 + signal.SIGKILL
    assert process.command_pid() is None


OWNER = textwrap.dedent(
    """
    import sys, time
    from actorsys.fleet._proc.process import spawn
    process = spawn("tree", [sys.executable, "-c", sys.argv[1]], grace=1.0)
    print(process.pid, flush=True)
    time.sleep(300)
    """
)


@pytest.mark.timeout(90)
async def test_owner_killed_with_sigkill_leaves_no_orphans() -> None:
    owner = await trio.lowlevel.open_process(
        [sys.executable, "-c", OWNER, PARENT_WITH_CHILD], stdout=subprocess.PIPE
    )
    try:
        assert owner.stdout is not None
        line = b""
        while not line.endswith(b"\n"):
            line += await owner.stdout.receive_some(64)
        reaper = int(line)
        pids = await wait_for_tree(reaper, 2)
        owner.kill()
        await wait_gone([reaper, *pids])
    finally:
        owner.kill()
        await owner.wait()


@pytest.mark.timeout(60)
async def test_command_dies_with_its_reaper_when_the_reaper_is_sigkilled() -> None:
    # What Ray does to the children of a killed actor's worker: no chance to stop the group.
    process = spawn("sleeper", ["sleep", "300"], grace=5.0)
    [command] = await wait_for_tree(process.pid, 1)
    os.kill(process.pid, signal.SIGKILL)
    await process.wait()
    await wait_gone([command])

"""Checkpoints are checked as files: a FIFO, a device or a socket in a checkpoint (itself or
behind a link) is refused at once, where opening it would wait for good; a link to a regular
file stays fine. The CPU engine checks before it takes any lock, the vLLM client's abandoned
check keeps no token, and ``watch`` leaves such a checkpoint out. Real FIFOs (``os.mkfifo``),
real sockets and devices; every wait is bounded."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import trio

from actorsys import VLLMEngine
from actorsys.fleet.checkpoint import (
    CheckpointMismatchError,
    check_checkpoint,
    read_config,
    read_tensor_infos,
)
from actorsys.fleet.clients import vllm as vllm_client
from actorsys.fleet.embedded.model import ModelHost
from actorsys.fleet.embedded.server import EmbeddedEngine
from actorsys.fleet.on_all import CheckpointRejectedError
from tests.fleet.conftest import TinyModels

WAIT = 20.0
"""Seconds a check may take here before the test calls it stuck (it takes milliseconds)."""


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: a unix socket's path is limited to about 100 bytes."""
    path = Path(tempfile.mkdtemp(prefix="ck", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _unblock(fifo: Path) -> None:
    """Let a reader stuck opening ``fifo`` go (it reads end of file), if there is one."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def in_bounded_thread(call: Callable[[], object], fifos: list[Path]) -> BaseException | None:
    """Run ``call`` in a thread; fail the test if it has not returned within WAIT seconds (the
    FIFOs are then opened for writing, so the thread ends too). What it raised, or None."""
    raised: list[BaseException | None] = [None]

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            raised[0] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WAIT)
    stuck = thread.is_alive()
    for fifo in fifos:
        _unblock(fifo)
    thread.join(WAIT)
    assert not stuck, "the check waited on a file that is not a regular one"
    return raised[0]


def check(path: Path, tiny: TinyModels) -> None:
    check_checkpoint(str(path), require_complete=True, served_config=read_config(str(tiny.base)),
                     served_tensors=read_tensor_infos(str(tiny.base)))


def with_special(tiny: TinyModels, root: Path, name: str, kind: str) -> tuple[Path, list[Path]]:
    """A copy of ``tiny.step1`` whose ``name`` is a ``kind``: "fifo", "fifo-link" (a link to a
    FIFO outside it), "socket", "device" (a link to /dev/zero, which never ends)."""
    path = root / "step_1"
    shutil.copytree(tiny.step1, path)
    target = path / name
    target.unlink(missing_ok=True)
    fifos = []
    if kind == "fifo":
        os.mkfifo(target)
        fifos.append(target)
    elif kind == "fifo-link":
        os.mkfifo(root / "elsewhere")
        target.symlink_to(root / "elsewhere")
        fifos.append(root / "elsewhere")
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(target))
        server.close()
    else:
        target.symlink_to("/dev/zero")
    return path, fifos


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("name", "kind", "said"),
    [
        ("config.json", "fifo", "'config.json' (a FIFO)"),
        ("model.safetensors", "fifo", "'model.safetensors' (a FIFO)"),
        ("model.safetensors", "fifo-link", "'model.safetensors' (a FIFO)"),
        ("model.safetensors", "device", "'model.safetensors' (a character device)"),
        ("generation_config.json", "socket", "'generation_config.json' (a socket)"),
    ],
)
def test_a_fifo_device_or_socket_in_a_checkpoint_is_refused_at_once(
    tiny: TinyModels, short_dir: Path, name: str, kind: str, said: str
) -> None:
    path, fifos = with_special(tiny, short_dir, name, kind)
    raised = in_bounded_thread(lambda: check(path, tiny), fifos)
    assert isinstance(raised, CheckpointMismatchError), raised
    assert said in str(raised)


def test_links_to_regular_files_stay_fine(tiny: TinyModels, tmp_path: Path) -> None:
    path = tmp_path / "step_1"
    shutil.copytree(tiny.step1, path)
    for name in ("model.safetensors", "config.json"):
        shutil.move(path / name, tmp_path / name)
        (path / name).symlink_to(tmp_path / name)
    check(path, tiny)


@pytest.mark.timeout(120)
async def test_the_cpu_engine_refuses_a_fifo_checkpoint_without_waiting_for_its_batch_lock(
    tiny: TinyModels, short_dir: Path
) -> None:
    path, fifos = with_special(tiny, short_dir, "model.safetensors", "fifo")
    host = await trio.to_thread.run_sync(lambda: ModelHost(str(tiny.base)))
    engine = EmbeddedEngine(host)
    transport = httpx.ASGITransport(app=engine.app())
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://engine") as client:
            async with engine.lock:  # a batch that runs for as long as the test likes
                with trio.fail_after(WAIT):
                    response = await client.post(
                        "/update_weights_from_disk", json={"model_path": str(path)})
        assert response.status_code == 400
        assert "'model.safetensors' (a FIFO)" in response.json()["message"]
        assert host.version != "step_1" and host.model_path == str(tiny.base)
    finally:
        for fifo in fifos:
            _unblock(fifo)


@pytest.mark.timeout(120)
async def test_the_vllm_client_refuses_a_fifo_checkpoint_at_once(
    tiny: TinyModels, short_dir: Path
) -> None:
    path, fifos = with_special(tiny, short_dir, "config.json", "fifo")
    engine = VLLMEngine("http://127.0.0.1:9", served_model_dir=str(tiny.base))
    try:
        with trio.fail_after(WAIT), pytest.raises(CheckpointRejectedError, match="a FIFO"):
            await engine._check(str(path))
    finally:
        for fifo in fifos:
            _unblock(fifo)


@pytest.mark.timeout(60)
async def test_an_abandoned_vllm_check_keeps_no_token_a_later_check_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entered, release = threading.Event(), threading.Event()
    checked: list[str] = []

    def fake_check(path: str, **_: object) -> dict[str, object]:
        if path == "stuck":
            entered.set()
            release.wait(WAIT)  # a filesystem that stopped answering
        checked.append(path)
        return {}

    monkeypatch.setattr(vllm_client, "check_checkpoint", fake_check)
    engine = VLLMEngine("http://127.0.0.1:9")
    engine._reference = (None, None)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(engine._check, "stuck")
            with trio.fail_after(WAIT):
                await trio.to_thread.run_sync(entered.wait, WAIT)
            nursery.cancel_scope.cancel()
        with trio.fail_after(WAIT):
            await engine._check("next")
        assert checked == ["next"]
        assert engine.threads.running(), "the abandoned check is still listed"
    finally:
        release.set()

"""The edges keep trio's rules too: the watcher, the fleets it starts, a local fleet, a Ray
fleet's open and an external server make no file operation, read no log and call nothing of
Ray's on the trio thread (``actorsys.runtime.run_blocking`` runs them in worker threads)."""

from __future__ import annotations

import gc
import importlib.abc
import importlib.util
import os
import shutil
import sys
import threading
import weakref
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import trio

from actorsys import JsonlSink, SGLangEngine
from actorsys.fleet._proc.process import ManagedProcess
from actorsys.fleet.external import ExternalServer
from actorsys.fleet.local import LocalFleet
from actorsys.fleet.on_all import EngineUnhealthyError, FleetStartError
from actorsys.fleet.ray import RayFleet
from actorsys.watch import fleets as watch_fleets
from actorsys.watch.scan import Checkpoint
from tests.fleet.test_launcher import stub
from tests.watch.test_watch import Recording, checkpoint, watcher

from .test_trio_thread_io import TrioThreadWatch

EDGE_CALLS = (
    (os, "makedirs"), (os, "mkdir"), (os, "remove"), (os, "fsync"), (shutil, "rmtree"),
    (ManagedProcess, "log_tail"), (JsonlSink, "close"),
)
CRASH = "import sys; print('cannot bind', file=sys.stderr); sys.exit(3)"


async def test_a_watch_run_opens_writes_and_closes_its_files_off_the_trio_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ckpt"
    for step in (10, 20):
        checkpoint(root, f"step_{step}")
    watch = TrioThreadWatch(monkeypatch, EDGE_CALLS)
    report = await watcher(root, tmp_path / "out", Recording(poison=[20]), max_attempts=1).run()
    assert report.ok == [10] and report.failed == [20]
    assert watch.on_trio_thread == []
    assert {"makedirs", "fsync", "close"} <= set(watch.calls)


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_a_local_fleet_and_the_watchers_fleets_touch_no_file_on_the_trio_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint(tmp_path, "step_1")
    watch = TrioThreadWatch(monkeypatch, EDGE_CALLS)
    # A start that fails reads the engine's log; the temporary log directory is made and
    # removed; a given one is made.
    with pytest.raises(FleetStartError, match="exited with status 3") as caught:
        async with LocalFleet.open([stub(CRASH)], grace=2.0):
            pass
    assert "cannot bind" in str(caught.value)
    async with LocalFleet.open([stub()], log_dir=str(tmp_path / "logs" / "a"), grace=2.0) as local:
        await local.engines[0].client.health()
    assert (tmp_path / "logs" / "a" / "stub-0.log").exists()

    monkeypatch.setattr(watch_fleets, "engine_specs",
                        watch.wrap("engine_specs", lambda path, **_: [stub(), stub()]))
    point = Checkpoint(1, "step_1", str(tmp_path / "step_1"), marked=True)
    async with watch_fleets.started_fleets(point, engines=2, fleets=2, flavor="sglang",
                                           log_dir=None) as fleets:
        assert len(fleets) == 2
        for fleet in fleets:
            await fleet.engines[0].health()

    assert watch.on_trio_thread == []
    assert {"mkdir", "makedirs", "rmtree", "log_tail", "engine_specs"} <= set(watch.calls)


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_a_launched_server_that_dies_has_its_log_read_and_removed_off_the_trio_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = ExternalServer(
        url=None, launch=[sys.executable, "-c", CRASH, "{port}"], flavor="sglang",
        ready_timeout=30.0, grace=2.0,
        make_engine=lambda flavor, url: SGLangEngine(url, api_key=server.api_key),
    )
    watch = TrioThreadWatch(monkeypatch, EDGE_CALLS)
    started = trio.current_time()
    try:
        with pytest.raises(EngineUnhealthyError, match="exited with status 3") as caught:
            await server.fleet()
    finally:
        await server.stop()
    assert trio.current_time() - started < 20  # its exit ended the wait, not the deadline
    assert "cannot bind" in str(caught.value)
    assert watch.on_trio_thread == []
    assert {"log_tail", "remove"} <= set(watch.calls)


class ObjectRef:
    """A reference to an object of the driver, as ``ray.put`` returns it."""

    def __init__(self, value: Any) -> None:
        self.value = value


class FakeRay:
    """What ``RayFleet.open`` calls of Ray, as a module that a finder hands to ``import ray``:
    every call (and the import itself) is counted by the watch; actors answer their URL at
    once."""

    def __init__(self, watch: TrioThreadWatch) -> None:
        self.watch = watch
        self.killed: list[Any] = []
        self.key_ref: weakref.ref[ObjectRef] | None = None
        self.module = ModuleType("ray")
        self.module.exceptions = SimpleNamespace(RayError=type("RayError", (Exception,), {}))  # type: ignore[attr-defined]
        for name in ("remote", "put", "kill", "is_initialized", "cancel"):
            setattr(self.module, name, watch.wrap(f"ray.{name}", getattr(self, name)))

    def remote(self, cls: type) -> Any:
        return SimpleNamespace(options=lambda **options: SimpleNamespace(
            remote=self.watch.wrap("actor_class.remote", self.actor)))

    def actor(self, name: str, *args: Any) -> Any:
        answer: Future[str] = Future()
        answer.set_result(f"http://127.0.0.1:1/{name}")
        ref = SimpleNamespace(future=lambda: answer)
        url = SimpleNamespace(remote=self.watch.wrap("actor.url.remote", lambda: ref))
        return SimpleNamespace(name=name, url=url)

    def put(self, value: Any) -> ObjectRef:
        ref = ObjectRef(value)
        self.key_ref = weakref.ref(ref)
        return ref

    def kill(self, actor: Any, *, no_restart: bool) -> None:
        self.killed.append(actor.name)

    def is_initialized(self) -> bool:
        return True

    def cancel(self, ref: Any, *, force: bool) -> None:
        pass


class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, fake: FakeRay) -> None:
        self.fake = fake

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        return importlib.util.spec_from_loader(name, self) if name == "ray" else None

    def create_module(self, spec: Any) -> ModuleType:
        self.fake.watch.wrap("import ray", lambda: None)()
        return self.fake.module

    def exec_module(self, module: ModuleType) -> None:
        pass


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRay]:
    fake = FakeRay(TrioThreadWatch(monkeypatch, ()))
    monkeypatch.setattr(sys, "meta_path", [Finder(fake), *sys.meta_path])
    real = sys.modules.pop("ray", None)
    try:
        yield fake
    finally:
        sys.modules.pop("ray", None)
        if real is not None:
            sys.modules["ray"] = real


async def test_a_ray_fleet_imports_creates_and_kills_its_actors_off_the_trio_thread(
    fake_ray: FakeRay, tmp_path: Path
) -> None:
    watch = fake_ray.watch
    async with RayFleet.open(tmp_path, num_engines=2) as ray_fleet:
        assert [engine.name for engine in ray_fleet.engines] == ["ray-embedded-0",
                                                                  "ray-embedded-1"]
        # The key's reference lives as long as the fleet: Ray resolves it again at every
        # restart of an actor, and frees the object once no reference is held.
        gc.collect()
        assert fake_ray.key_ref is not None and fake_ray.key_ref() is not None
    assert fake_ray.killed == ["ray-embedded-0", "ray-embedded-1"]
    assert watch.on_trio_thread == []
    assert {"import ray", "ray.remote", "ray.put", "actor_class.remote", "actor.url.remote",
            "ray.is_initialized", "ray.kill"} <= set(watch.calls)
    assert threading.get_ident() == watch.trio_thread

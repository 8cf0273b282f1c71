"""No file operation of a pipeline run blocks the trio thread: every fsync, rename, delete and
free-space check runs in a worker thread (``actorsys.runtime.run_blocking``), and so does
opening a child process's log."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from actorsys import EvalConfig, EvalSupervisor, JsonlSink, staging
from actorsys.fleet._proc import process as process_module
from tests.conftest import snapshot_dirs, tmp_dirs
from tests.fakes import RecordingEval, tiny_state_dict, written_export

WATCHED = ((os, "fsync"), (os, "rename"), (os, "statvfs"), (shutil, "rmtree"))


class TrioThreadWatch:
    """Wraps the watched calls; remembers each one made in the trio thread, with its stack."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, watched: Sequence[tuple[Any, str]] = WATCHED
    ) -> None:
        self.trio_thread = threading.get_ident()
        self.calls: dict[str, int] = {}
        self.on_trio_thread: list[str] = []
        for owner, name in watched:
            monkeypatch.setattr(owner, name, self.wrap(name, getattr(owner, name)))

    def wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        """``real``, counted as ``name`` and remembered when called on the trio thread."""

        def watched(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            if threading.get_ident() == self.trio_thread:
                stack = "".join(traceback.format_stack(limit=8)[:-1])
                self.on_trio_thread.append(f"{name}{args!r}\n{stack}")
            return real(*args, **kwargs)

        return watched


async def test_a_pipeline_run_never_fsyncs_renames_deletes_or_statvfs_on_the_trio_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    # What an earlier, crashed run left: a marked tmp dir (swept at open) and a stale step_4
    # (replaced when step 4 is published).
    for leftover in (hf / ".tmp-step_9-crashed", hf / "step_4"):
        leftover.mkdir()
        (leftover / staging.MARKER).write_bytes(b"")
    given = tmp_path / "given"
    given.mkdir()
    (given / "model.safetensors").write_bytes(b"w")
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    watch = TrioThreadWatch(monkeypatch)

    async def wrote_nothing(step: int, path: str) -> None:
        await trio.lowlevel.checkpoint()

    config = EvalConfig(hf_dir=hf, keep_snapshots=1, max_in_flight=2)
    async with EvalSupervisor.open(config, eval_fn=RecordingEval(), sink=sink) as sup:
        await sup.submit(1, state_dict=tiny_state_dict())
        await sup.submit(2, export=written_export)
        await sup.submit(3, export=wrote_nothing)
        await sup.submit(4, state_dict=tiny_state_dict(1))
        await sup.submit(5, checkpoint_dir=given)
        await sup.drain()
    await trio.to_thread.run_sync(sink.close)

    assert watch.on_trio_thread == []
    assert {"fsync", "rename", "statvfs", "rmtree"} <= set(watch.calls)
    assert snapshot_dirs(hf) == ["step_4"] and tmp_dirs(hf) == []
    assert os.listdir(given) == ["model.safetensors"]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sorted((row["step"], row["reason"]) for row in rows) == [
        (1, None), (2, None), (3, "export_failed"), (4, None), (5, None)
    ]


@pytest.mark.timeout(30)
async def test_a_trio_owner_opens_its_child_process_log_off_the_trio_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    watch = TrioThreadWatch(monkeypatch, [(process_module, "open_private")])
    log = tmp_path / "child.log"
    child = await process_module.start(
        "child", [sys.executable, "-c", "print('hello')"], log_path=str(log), grace=1.0
    )
    assert await child.wait() == 0
    assert watch.on_trio_thread == [] and watch.calls == {"open_private": 1}
    assert log.read_text() == "hello\n"

"""Light scoring workers, started and warmed when the supervisor opens.

Importing the scorers imports neither torch nor transformers (the packages around them import
their names on first use), nor does a worker after scoring; a supervisor whose eval fn scores
datasets starts and warms the workers in the background (its open does not wait, its first
point finds them ready) and its close cancels that warming, killing the workers it was
starting. Cold pools run in a fresh interpreter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.testing

from actorsys import EvalConfig, EvalSupervisor
from actorsys.evals import DatasetEval, EvalDataset
from tests.evals import slow_import_scorer
from tests.evals.conftest import running
from tests.evals.test_scoring_cold import ROOT, run_fresh
from tests.fakes import RecordingEval

SCORER_MODULES = ("actorsys.evals.scoring.scorers", "actorsys.evals.scoring.miles_rewards",
                  "actorsys.evals.scoring.remote_rm", "actorsys.evals.scoring.grading",
                  "actorsys.evals.scoring.jobs")


@pytest.mark.timeout(120)
def test_importing_the_scorers_imports_neither_torch_nor_transformers() -> None:
    code = (
        f"import importlib, sys\nfor name in {SCORER_MODULES!r}:\n    importlib.import_module(name)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'actorsys.fleet', 'actorsys.snapshot') "
        "if m in sys.modules))\n"
        "import actorsys.evals.scoring.pool\nprint('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=100, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["[]", "False"]


AFTER_SCORING = """
import json, sys

def loaded():
    import os, sys
    return os.getpid(), sorted(m for m in ("torch", "transformers", "trio") if m in sys.modules)

async def main():
    import trio
    from actorsys.evals.scoring import pool as scoring_pool
    from actorsys.evals.scoring.grading import Grader
    items = [("\\\\boxed{2}", "2", None), ("no", "2", None)] * 40
    scored = await scoring_pool.score_in_workers("math", items, score_timeout=60.0)
    graded = await scoring_pool.score_in_workers(
        Grader("boxed_math", math=True), [("\\\\boxed{2}", "2", {})], score_timeout=60.0
    )
    found = []

    async def look():
        found.append(await scoring_pool._in_worker(60.0, loaded))

    async with trio.open_nursery() as nursery:  # one look on each worker, all at once
        for _ in range(scoring_pool.SCORING_WORKERS):
            nursery.start_soon(look)
    print(json.dumps({"scores": [s.value for s in scored[:2]] + [graded[0].value],
                      "workers": found}))

if __name__ == "__main__":
    import trio
    trio.run(main)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="spawned workers import the main module")
@pytest.mark.timeout(300)
def test_a_scoring_worker_has_imported_neither_torch_nor_transformers_nor_trio_after_scoring(
    tmp_path: Path,
) -> None:
    found = cast(dict[str, Any], run_fresh(AFTER_SCORING, tmp_path))
    assert found["scores"] == [1.0, 0.0, 1.0]
    workers = found["workers"]
    assert workers and all(pid != os.getpid() for pid, _ in workers)
    assert [modules for _, modules in workers] == [[]] * len(workers)


WARM_AT_OPEN = """
import json, multiprocessing, sys

async def main():
    import trio, trio_parallel
    from actorsys import EvalConfig, EvalSupervisor
    from actorsys.evals import DatasetEval, EvalDataset
    from actorsys.evals.scoring import pool as scoring_pool
    data = EvalDataset(name="m", records=({"prompt": "p", "label": "2"},), scorer="math",
                       score_timeout=2.0)
    warm = scoring_pool.SCORING_WORKERS
    async with EvalSupervisor.open(EvalConfig(), eval_fn=DatasetEval(data)):
        at_open = trio_parallel.default_context_statistics().idle_workers
        with trio.fail_after(200):
            while trio_parallel.default_context_statistics().idle_workers < warm:
                await trio.sleep(0.05)
        warmed = sorted(p.pid for p in multiprocessing.active_children())
        tower = "\\\\boxed{9^{9^{9^{9}}}}"
        first = await scoring_pool.score_in_workers(
            "math", [("\\\\boxed{2}", "2", None)] * 3, score_timeout=2.0
        )
        same = sorted(p.pid for p in multiprocessing.active_children())
        cut = await scoring_pool.score_in_workers(
            "math", [("\\\\boxed{2}", "2", None), (tower, "2", None)], score_timeout=2.0
        )
        after = await scoring_pool.score_in_workers(
            "math", [("\\\\boxed{2}", "2", None)] * warm, score_timeout=2.0
        )
    print(json.dumps({
        "at_open": at_open, "warm": warm, "same_workers": warmed == same and len(warmed) == warm,
        "first": [s.value for s in first], "cut": [[s.value, s.error] for s in cut],
        "after": [[s.value, s.error] for s in after],
    }))

if __name__ == "__main__":
    import trio
    trio.run(main)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_supervisor_starts_and_warms_the_scoring_workers_in_the_background_when_it_opens(
    tmp_path: Path,
) -> None:
    """Its open does not wait for them; its first point's scoring runs on the workers it
    warmed, within a two-second ``score_timeout`` from a cold interpreter; a hanging answer
    scores 0 and its killed worker is replaced and warmed before the next call scores."""
    found = cast(dict[str, Any], run_fresh(WARM_AT_OPEN, tmp_path))
    assert found["at_open"] == 0
    assert found["same_workers"] is True
    assert found["first"] == [1.0, 1.0, 1.0]
    (plain, plain_error), (hanging, hanging_error) = found["cut"]
    assert (plain, plain_error) == (1.0, None)
    assert hanging == 0.0 and "took longer than score_timeout=2.0 s" in hanging_error
    assert found["after"] == [[1.0, None]] * found["warm"]


@pytest.mark.timeout(120)
async def test_closing_the_supervisor_cancels_the_warming_and_kills_the_workers_it_was_starting(
) -> None:
    importing = slow_import_scorer.importing_dir(os.getpid())
    shutil.rmtree(importing, ignore_errors=True)
    data = EvalDataset(name="slow", records=({"prompt": "p", "label": "l"},),
                       scorer=slow_import_scorer.slow)
    try:
        async with EvalSupervisor.open(EvalConfig(), eval_fn=DatasetEval(data)) as sup:
            with trio.fail_after(60):
                while not importing.exists() or not any(importing.iterdir()):  # noqa: ASYNC110 - a worker writes it
                    await trio.sleep(0.05)
            started = time.monotonic()
            report = await sup.aclose()
        closed_in = time.monotonic() - started
        pids = [int(path.name) for path in importing.iterdir()]
    finally:
        shutil.rmtree(importing, ignore_errors=True)
    assert report.clean
    assert closed_in < 30.0  # the import would take 600 s
    assert running(pids) == []


class WarmingForever(RecordingEval):
    """An eval fn whose warm-up never ends until cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.warming = trio.Event()
        self.cancelled = False

    async def _warm_up(self) -> None:
        self.warming.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.cancelled = True
            raise


async def test_the_eval_fns_warm_up_runs_in_the_background_and_close_cancels_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    eval_fn = WarmingForever()
    with trio.fail_after(60):
        async with EvalSupervisor.open(EvalConfig(), eval_fn=eval_fn) as sup:
            await eval_fn.warming.wait()
            assert await sup.submit(1, checkpoint_dir=tmp_path)
            assert (await sup.drain()).settled == [1]
        assert eval_fn.cancelled
    assert [step for step, _, _ in eval_fn.seen] == [1]

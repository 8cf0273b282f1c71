"""A cold scoring pool: the workers start light (the scorers, not torch) and warm before any
answer's ``score_timeout`` starts, so a short budget counts only the scoring. Each case runs
in a fresh interpreter, whose pool is cold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

COLD_POOL = """
import json, sys, trio

async def main():
    from actorsys.evals.scoring.pool import score_in_workers
    tower = "\\\\boxed{9^{9^{9^{9}}}}"
    scored = await score_in_workers(
        "math", [("\\\\boxed{2}", "2", None), (tower, "2", None)], score_timeout=2.0
    )
    print(json.dumps([[s.value, s.error] for s in scored]))

if __name__ == "__main__":
    trio.run(main)
"""

LIGHT_WORKER = """
import json, sys, trio

async def main():
    from actorsys.evals.scoring import jobs as scoring_jobs, pool as scoring_pool
    from actorsys.evals.scoring.grading import Grader
    scorer = Grader("deepscaler", math=True) if sys.argv[1] == "grader" else "math"
    pid = await scoring_pool._in_worker(120.0, scoring_jobs.warm_up, [scorer])
    with open(f"/proc/{pid}/maps") as f:
        maps = f.read()
    print(json.dumps({"torch": "libtorch" in maps, "transformers": "transformers" in maps}))

if __name__ == "__main__":
    trio.run(main)
"""


def run_fresh(source: str, tmp_path: Path, *args: str) -> object:
    script = tmp_path / "fresh.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          env=env, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_cold_pool_with_a_two_second_budget_scores_the_plain_answer_and_cuts_the_hanging_one(
    tmp_path: Path,
) -> None:
    (plain, plain_error), (hanging, hanging_error) = run_fresh(COLD_POOL, tmp_path)  # type: ignore[misc]
    assert (plain, plain_error) == (1.0, None)
    assert hanging == 0.0 and "took longer than score_timeout=2.0 s" in hanging_error


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("scorer", ["math", "grader"])
def test_a_scoring_worker_imports_the_scorers_not_torch(tmp_path: Path, scorer: str) -> None:
    """Also for a dataset's Grader, which brings the reward types and the remote reward
    client."""
    assert run_fresh(LIGHT_WORKER, tmp_path, scorer) == {"torch": False, "transformers": False}

"""Per-dataset intervals through the watch loop: a dataset skipped at a step is no failure, the
checkpoint is done, and it is not evaluated again; the eval key follows the interval."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import trio

from actorsys import RolloutFnEvalInput, RolloutFnEvalOutput
from actorsys.evals import DatasetEval, EvalDataset
from actorsys.watch.service import eval_key
from tests.fakes import ScriptedFleet
from tests.watch.test_watch import checkpoint, ledger_lines, watcher


class OnScriptedFleet(DatasetEval):
    """DatasetEval itself, sampling from a scripted fleet instead of the pinned fake engine."""

    def __init__(self, datasets: list[EvalDataset]) -> None:
        super().__init__(datasets)
        self.fleet = ScriptedFleet(lambda prompt, k: "yes")
        self.steps: list[int] = []

    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        self.steps.append(input.rollout_id)
        scripted = dataclasses.replace(input, fleet=self.fleet)
        output: RolloutFnEvalOutput = await super().evaluate_checkpoint(checkpoint_dir, scripted)
        return output


def datasets(every: int) -> list[EvalDataset]:
    return [
        EvalDataset(name="cheap", records=({"prompt": "cheap?", "label": "yes"},)),
        EvalDataset(name="aime", records=({"prompt": "aime?", "label": "yes"},), interval=every),
    ]


async def test_watch_scores_each_dataset_at_its_own_steps_and_settles_every_checkpoint_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    root, out = tmp_path / "ckpt", tmp_path / "out"
    root.mkdir()
    for step in (10, 20, 30, 40):
        checkpoint(root, f"step_{step}")
    sets = datasets(20)
    key = eval_key(sets)
    evals = OnScriptedFleet(sets)
    report = await watcher(root, out, evals, key=key).run()
    assert report.ok == [10, 20, 30, 40] and report.failed == []
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    scored = {row["step"]: sorted(k for k in row["metrics"] if k in ("eval/aime", "eval/cheap"))
              for row in rows}
    assert scored == {10: ["eval/cheap"], 20: ["eval/aime", "eval/cheap"], 30: ["eval/cheap"],
                      40: ["eval/aime", "eval/cheap"]}
    assert all(row["status"] == "ok" for row in rows)
    assert [row["data"].get("not_due") for row in rows] == [["aime"], None, ["aime"], None]
    assert [(e["step"], e["status"]) for e in ledger_lines(out)] == [
        (10, "ok"), (20, "ok"), (30, "ok"), (40, "ok")
    ]
    prompts = [p for call in evals.fleet.calls for p in call["prompts"]]
    assert prompts.count("aime?") == 2 and prompts.count("cheap?") == 4

    again = OnScriptedFleet(sets)
    report = await watcher(root, out, again, key=key).run()
    assert again.steps == [] and report.ok == [], "a skipped dataset made a settled step due"

    # another interval is other settings: the backlog is due again under the new key
    other = datasets(10)
    assert eval_key(other) != key
    rerun = OnScriptedFleet(other)
    report = await watcher(root, out, rerun, key=eval_key(other)).run()
    assert rerun.steps == [10, 20, 30, 40]

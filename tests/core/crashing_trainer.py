"""A trainer that is killed with points in flight (run by tests/core/test_resume_after_kill.py).

``python -m tests.core.crashing_trainer HF_DIR METRICS``: a real supervisor exports real
snapshots of a tiny Llama whose weights are those of ``tiny_llama(seed=step)``. Step 0 is
evaluated and settles; steps 1 and 2 are exported and their evaluations block (the first
evaluates, the second waits for the one fleet); the delegated export of step 3 writes half a
weight file and blocks. Once the journal shows all four admitted it prints ``ready`` and waits
to be killed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import trio

from actorsys import CheckpointEvalFn, EvalConfig, EvalSupervisor, JsonlSink, RolloutFnEvalInput
from actorsys import RolloutFnEvalOutput as Output
from actorsys._core.journal import JOURNAL_NAME, read_pending
from tests.snapshot.snapshot_models import tiny_llama

IN_FLIGHT = (1, 2, 3)


class BlockingEval(CheckpointEvalFn):
    """Scores step 0; every later evaluation blocks until the process is killed."""

    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        if input.rollout_id == 0:
            return Output(data={}, metrics={"score": 0.0})
        await trio.sleep_forever()


async def half_export(step: int, path: str) -> None:
    Path(path, "model.safetensors").write_bytes(b"\x00" * 64)
    await trio.sleep_forever()


def wait_in_flight(hf_dir: str) -> None:
    """Until the journal on disk shows steps 1-3 admitted and unsettled, and step 2 is
    published (a process of its own, polling the files another thread writes)."""
    journal = str(Path(hf_dir, JOURNAL_NAME))
    while True:
        if [p.step for p in read_pending(journal)] == list(IN_FLIGHT) and Path(hf_dir, "step_2").is_dir():
            return
        time.sleep(0.05)


async def main(hf_dir: str, metrics: str) -> None:
    config = EvalConfig(hf_dir=hf_dir, max_in_flight=4, keep_snapshots=1, probe=False)
    async with EvalSupervisor.open(config, eval_fn=BlockingEval(), sink=JsonlSink(metrics)) as sup:
        await sup.submit(0, model=tiny_llama(seed=0))
        await sup.drain()
        await sup.submit(1, model=tiny_llama(seed=1))
        await sup.submit(2, model=tiny_llama(seed=2))
        await sup.submit(3, export=half_export)
        await trio.to_thread.run_sync(wait_in_flight, hf_dir)
        print("ready", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:3])

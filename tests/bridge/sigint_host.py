"""A training process for the Ctrl-C test: trains a small torch model, submits an eval point
every other step (the evaluations hang in a worker thread), and prints ``training`` once
points are in flight. Ctrl-C must end it within ``close_timeout`` + 1 s.

Usage: ``python sigint_host.py STAGING_DIR CLOSE_TIMEOUT``; on the way out it prints the close
report as one JSON line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading

import torch

from actorsys import CheckpointEvalFn, EvalConfig, RolloutFnEvalInput
from bridge import EvalBridge


class Stuck(CheckpointEvalFn):
    runtime = "thread"

    def evaluate_checkpoint(self, checkpoint_dir: str, eval_input: RolloutFnEvalInput) -> None:
        threading.Event().wait()


def main(staging: str, close_timeout: float) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    config = EvalConfig(
        hf_dir=staging, overflow="skip", max_in_flight=2, close_timeout=close_timeout
    )
    bridge = EvalBridge(config, eval_fn=Stuck())
    try:
        with bridge:
            step, announced = 0, False
            while True:
                inputs = torch.randn(32, 256)
                loss = model(inputs).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if step % 2 == 0:
                    bridge.submit(step, model=model)
                if not announced and bridge.statistics().in_flight == config.max_in_flight:
                    print("training", flush=True)
                    announced = True
                step += 1
    finally:
        print(json.dumps(dataclasses.asdict(bridge.close())), flush=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1], float(sys.argv[2]))
    except KeyboardInterrupt:
        # End by the signal itself, as a shell expects of Ctrl-C. The interpreter's own exit
        # on an unhandled KeyboardInterrupt was seen to end this process with status 1
        # instead (it finalized with SIGINT reset and never re-raised it).
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)

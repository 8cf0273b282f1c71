"""An ``asyncio.run`` host for the no-side-effects test, run in a fresh interpreter.

Records the host's asyncio and signal state before importing actorsys, after importing it,
and after running an asyncio eval fn through AsyncEvalBridge; prints them as one JSON line.
Usage: ``python asyncio_host.py CHECKPOINT_DIR``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
from typing import Any

SIGNALS = ("SIGINT", "SIGTERM", "SIGCHLD", "SIGHUP", "SIGPIPE", "SIGUSR1")


async def running_loop_type() -> str:
    return type(asyncio.get_running_loop()).__qualname__


def host_state() -> dict[str, Any]:
    wakeup_fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup_fd)
    policy = asyncio.get_event_loop_policy()
    return {
        "policy": f"{type(policy).__module__}.{type(policy).__qualname__}#{id(policy)}",
        "loop": asyncio.run(running_loop_type()),
        "signals": {name: repr(signal.getsignal(getattr(signal, name))) for name in SIGNALS},
        "wakeup_fd": wakeup_fd,
        "non_daemon_threads": sorted(
            t.name
            for t in threading.enumerate()
            if not t.daemon and t is not threading.main_thread()
        ),
    }


def main(checkpoint_dir: str) -> None:
    before = host_state()
    from actorsys import CheckpointEvalFn, EvalConfig, RolloutFnEvalInput, RolloutFnEvalOutput
    from bridge import AsyncEvalBridge

    after_import = host_state()

    class LoopReport(CheckpointEvalFn):
        runtime = "asyncio"

        async def evaluate_checkpoint(
            self, checkpoint_dir: str, eval_input: RolloutFnEvalInput
        ) -> RolloutFnEvalOutput:
            await asyncio.sleep(0)
            return RolloutFnEvalOutput(data={
                "loop": type(asyncio.get_running_loop()).__qualname__,
                "thread": threading.current_thread().name,
            })

    async def host() -> dict[str, Any]:
        async with AsyncEvalBridge(EvalConfig(), eval_fn=LoopReport()) as bridge:
            inside = type(asyncio.get_running_loop()).__qualname__
            assert await bridge.submit(1, checkpoint_dir=checkpoint_dir)
            await bridge.drain(timeout=30)
            report = await bridge.close(timeout=10)
            outcome = bridge.sink.outcomes[0]  # type: ignore[attr-defined]
        return {"inside": inside, "status": outcome.status, "eval": outcome.data,
                "clean": report.clean}

    used = asyncio.run(host())
    after_use = host_state()
    print(json.dumps({"before": before, "after_import": after_import, "after_use": after_use,
                      "used": used}))


if __name__ == "__main__":
    main(sys.argv[1])

"""Deterministic stand-ins for the parts of the pipeline users supply: eval fns, engines,
exports. Each blocks only on events the test controls."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import trio

from actorsys import (
    CheckpointEvalFn,
    EvalSkip,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from actorsys.fleet.clients.completions import Completion, StaleWeightsError
from actorsys.runtime import run_in_eval_thread


def tiny_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "layer.weight": torch.randn(4, 4, generator=generator),
        "layer.bias": torch.randn(4, generator=generator),
    }


async def written_export(step: int, path: str) -> None:
    """A delegated export that writes a (fake) weight file at once."""
    Path(path, "model.safetensors").write_bytes(b"w")


class RecordingEval(CheckpointEvalFn):
    """Scores every checkpoint 1.0 and remembers what it saw."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str, str | None]] = []

    async def evaluate_checkpoint(
        self, checkpoint_dir: str, input: RolloutFnEvalInput
    ) -> RolloutFnEvalOutput:
        self.seen.append((input.rollout_id, checkpoint_dir, input.weight_version))
        await trio.lowlevel.checkpoint()
        return RolloutFnEvalOutput(
            data={"files": sorted(os.listdir(checkpoint_dir))}, metrics={"score": 1.0}
        )


class GatedEval(CheckpointEvalFn):
    """Each evaluation waits until the test opens its step's gate (``release(step)``)."""

    def __init__(self) -> None:
        self.gates: dict[int, trio.Event] = {}
        self.started: list[int] = []
        self._started_events: dict[int, trio.Event] = {}
        self.running = 0
        self.max_running = 0

    def gate(self, step: int) -> trio.Event:
        return self.gates.setdefault(step, trio.Event())

    def release(self, step: int) -> None:
        self.gate(step).set()

    async def wait_started(self, step: int) -> None:
        await self._started_events.setdefault(step, trio.Event()).wait()

    async def evaluate_checkpoint(
        self, checkpoint_dir: str, input: RolloutFnEvalInput
    ) -> RolloutFnEvalOutput:
        self.started.append(input.rollout_id)
        self._started_events.setdefault(input.rollout_id, trio.Event()).set()
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await self.gate(input.rollout_id).wait()
        finally:
            self.running -= 1
        return RolloutFnEvalOutput(data={}, metrics={"score": float(input.rollout_id)})


class HangingEval(CheckpointEvalFn):
    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        await trio.sleep_forever()


class ThreadHangingEval(CheckpointEvalFn):
    """A ``runtime="thread"`` eval blocked on an event only the test sets."""

    runtime = "thread"

    def __init__(self) -> None:
        self.unblock = threading.Event()

    def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        self.unblock.wait()
        return RolloutFnEvalOutput(data={})


class HelperHangingEval(CheckpointEvalFn):
    """A trio eval whose blocking work goes through ``run_in_eval_thread``: it lists the
    checkpoint there, then blocks its ``"scoring"`` on an event only the test sets."""

    def __init__(self) -> None:
        self.unblock = threading.Event()

    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        names = await run_in_eval_thread(
            lambda: sorted(os.listdir(checkpoint_dir)), abandon_on_cancel=False
        )
        await run_in_eval_thread(
            self.unblock.wait, abandon_on_cancel=True, description="scoring", hold_clock=False
        )
        return RolloutFnEvalOutput(data={"files": names})


class SkippingEval(CheckpointEvalFn):
    def __init__(self, reason: str) -> None:
        self.reason = reason

    async def evaluate_checkpoint(self, checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:
        raise EvalSkip(self.reason, "told to")


class FakeEngine:
    """An engine whose faults the test chooses."""

    def __init__(
        self,
        name: str,
        *,
        keep_old_weights: bool = False,
        healthy: bool = True,
        version_error: bool = False,
        load_gate: trio.Event | None = None,
    ) -> None:
        self.name = name
        self.keep_old_weights = keep_old_weights
        self.healthy = healthy
        self.version_error = version_error
        self.load_gate = load_gate
        self.version: str | None = None
        self.loads: list[tuple[str, str]] = []

    async def health(self) -> None:
        await trio.lowlevel.checkpoint()
        if not self.healthy:
            raise ConnectionError(f"{self.name} is down")

    async def load_weights(self, path: str, version: str) -> None:
        self.loads.append((path, version))
        if self.load_gate is not None:
            await self.load_gate.wait()
        await trio.lowlevel.checkpoint()
        if not self.keep_old_weights:
            self.version = version

    async def weight_version(self) -> str | None:
        await trio.lowlevel.checkpoint()
        if self.version_error:
            raise RuntimeError(f"{self.name} cannot say")
        return self.version


class ScriptedFleet:
    """A pinned fleet whose answers the test scripts: ``answer(prompt, k)`` is the text of the
    ``k``-th sample of ``prompt`` (None: that request failed after its retries). Records the
    settings of every ``complete`` call. ``stale_version`` makes every answer come from other
    weights."""

    def __init__(
        self,
        answer: Callable[[str, int], str | None],
        *,
        version: str = "1",
        stale_version: str | None = None,
        tokens: int | None = 3,
    ) -> None:
        self.answer = answer
        self.version = version
        self.stale_version = stale_version
        self.tokens = tokens
        self.calls: list[dict[str, Any]] = []

    async def complete(self, prompts: Sequence[str], **settings: Any) -> list[Completion]:
        await trio.lowlevel.checkpoint()
        self.calls.append({"prompts": list(prompts), **settings})
        if self.stale_version is not None:
            raise StaleWeightsError("fake://", 0, self.version, self.stale_version)
        seen: Counter[str] = Counter()
        answers = []
        for index, prompt in enumerate(prompts):
            text = self.answer(prompt, seen[prompt])
            seen[prompt] += 1
            if text is None:
                answers.append(Completion(index, prompt, "", None, None, "fake://", error="down"))
            else:
                answers.append(
                    Completion(index, prompt, text, "stop", self.version, "fake://", self.tokens)
                )
        return answers



class ChunkGate:
    """Holds the buffer pool's faulting in at a chunk boundary: the ``at``-th time it asks
    whether it was stopped (before chunk ``at``) waits until the test sets ``go``.

    ``allocate_faulted`` stays the real one (zeroing chunk by chunk, stopping once asked to);
    only the question it is handed is wrapped, so ``checks`` counts how often it asked.
    """

    def __init__(self, monkeypatch: Any, *, at: int) -> None:
        from actorsys.snapshot._pool import pool

        self.at = at
        self.checks = 0
        self.waiting = threading.Event()
        self.go = threading.Event()
        real = pool.allocate_faulted

        def gated(
            nbytes: int, *, pinned: bool, stopped: Callable[[], bool] | None = None
        ) -> torch.Tensor | None:
            assert stopped is not None, "the pool always says how to stop a preparation"

            def asked() -> bool:
                self.checks += 1
                if self.checks == self.at:
                    self.waiting.set()
                    assert self.go.wait(30), "the test never let the preparation go on"
                return stopped()

            return real(nbytes, pinned=pinned, stopped=asked)

        monkeypatch.setattr(pool, "allocate_faulted", gated)

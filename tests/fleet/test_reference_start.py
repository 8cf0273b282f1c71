"""When a pin starts the snapshot's reference: beside the engines' loads where the engines
compute on a CUDA device, once they answered the probe where they share this host's CPUs.
Either way the evaluation may start once the engines answered, and the verdict waits for
the reference."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import pytest
import trio
import trio.testing

from actorsys import Fleet
from actorsys.fleet import pinning
from actorsys.fleet.probe import Reference, compute_reference
from tests.fleet.conftest import TinyModels


class RecordedReference:
    """The snapshot's real reference (computed in a thread here), noting when it was asked."""

    def __init__(self) -> None:
        self.asked = trio.Event()

    async def compute(self, path: str, prompts: list[list[int]]) -> Reference:
        self.asked.set()
        return await trio.to_thread.run_sync(compute_reference, path, prompts)


class SnapshotEngine:
    """Serves the snapshot it is told to load (the probe's answer computed from it) and notes
    whether the reference had been asked for by the time it loaded and answered."""

    def __init__(self, reference: RecordedReference, *, load_waits_for_reference: bool) -> None:
        self.name = "engine"
        self.reference = reference
        self.load_waits_for_reference = load_waits_for_reference
        self.version: str | None = None
        self.path = ""
        self.asked_before_answer: bool | None = None

    async def health(self) -> None:
        await trio.lowlevel.checkpoint()

    async def load_weights(self, path: str, version: str) -> None:
        if self.load_waits_for_reference:
            with trio.fail_after(60):  # virtual time: a reference that never starts fails fast
                await self.reference.asked.wait()
        await trio.lowlevel.checkpoint()
        self.path, self.version = path, version

    async def weight_version(self) -> str | None:
        await trio.lowlevel.checkpoint()
        return self.version

    async def greedy_tokens(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
        answer = await trio.to_thread.run_sync(compute_reference, self.path)
        self.asked_before_answer = self.reference.asked.is_set()
        return answer.tokens


@pytest.mark.parametrize("beside", [True, False])
async def test_the_reference_starts_beside_the_loads_only_where_the_engines_use_cuda(
    tiny: TinyModels,
    monkeypatch: pytest.MonkeyPatch,
    autojump_clock: trio.testing.MockClock,
    beside: bool,
) -> None:
    monkeypatch.setattr(pinning, "reference_beside_loads", lambda: beside)
    reference = RecordedReference()
    engine = SnapshotEngine(reference, load_waits_for_reference=beside)
    fleet = Fleet([engine])
    async with trio.open_nursery() as nursery:
        verdict = await nursery.start(
            functools.partial(fleet.pin_and_verify, str(tiny.step1), "1", references=reference)
        )
        assert fleet.version == "1"
        assert engine.asked_before_answer is beside
        await verdict.wait()
    assert reference.asked.is_set()
    assert verdict.error is None and verdict.unverified is None


@pytest.mark.parametrize("cuda", [False, True])
def test_the_reference_starts_beside_the_loads_exactly_where_torch_sees_a_cuda_device(
    monkeypatch: pytest.MonkeyPatch, cuda: bool
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert pinning.reference_beside_loads() is cuda


def test_a_process_without_torch_never_imports_it_to_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.delitem(sys.modules, "torch")
    assert pinning.reference_beside_loads() is False
    assert "torch" not in sys.modules

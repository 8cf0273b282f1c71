"""The weight probe: a pin is trusted only when every engine computes what the snapshot
computes. Real tiny models behind the embedded engine's real ASGI app (in process), and
engines that lie in the two ways that matter: the right version over other weights, and no
way to probe at all."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest
import torch
import trio
import trio.testing

from actorsys import EvalConfig, EvalSupervisor, Fleet, MemorySink, SGLangEngine
from actorsys.fleet.embedded.model import ModelHost
from actorsys.fleet.embedded.server import EmbeddedEngine
from actorsys.fleet.pin.probe import (
    PROBE_TOKENS,
    PrefillAnswer,
    Reference,
    WeightProbe,
    WeightsMismatchError,
    asking,
    compute_reference,
    first_disagreement,
    prefill_disagreement,
    probe_prompts,
    reference_from_logits,
)
from actorsys.fleet.pin.reference import ReferenceWorker
from tests.fakes import FakeEngine, RecordingEval
from tests.fleet.conftest import Recorder, TinyModels
from tests.models import make_model, make_snapshot

URL = "http://engine"


async def embedded_engine(
    model_dir: Path, nursery: trio.Nursery, name: str = "cpu", **options: bool
) -> SGLangEngine:
    """The embedded engine serving ``model_dir`` in process, and its sglang client."""
    host = await trio.to_thread.run_sync(lambda: ModelHost(str(model_dir), **options))
    engine = EmbeddedEngine(host, max_batch=8)
    nursery.start_soon(engine.run)
    return SGLangEngine(URL, name=name, transport=httpx.ASGITransport(app=engine.app()))


class OtherWeightsEngine:
    """Reports whatever version it is told to load, and answers the probe with the weights of
    another checkpoint."""

    def __init__(self, name: str, serves: Path) -> None:
        self.name = name
        self.serves = serves
        self.version: str | None = None

    async def health(self) -> None:
        await trio.lowlevel.checkpoint()

    async def load_weights(self, path: str, version: str) -> None:
        await trio.lowlevel.checkpoint()
        self.version = version

    async def weight_version(self) -> str | None:
        await trio.lowlevel.checkpoint()
        return self.version

    async def greedy_tokens(
        self, prompts: Sequence[Sequence[int]], max_tokens: int
    ) -> list[list[int]]:
        reference = await trio.to_thread.run_sync(compute_reference, str(self.serves))
        assert [list(p) for p in prompts] == reference.prompts and max_tokens == PROBE_TOKENS
        return reference.tokens


async def test_engine_serving_the_snapshot_passes_the_probe_both_ways(
    tiny: TinyModels, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = Fleet([await embedded_engine(tiny.base, nursery)])
    with caplog.at_level(logging.WARNING, logger="actorsys.fleet"):
        for step, snapshot in ((1, tiny.step1), (2, tiny.step2), (3, tiny.step1)):
            await fleet.pin(str(snapshot), str(step))
            assert fleet.version == str(step)
    assert not [r for r in caplog.records if "weight probe" in r.getMessage()]


async def test_engine_labelling_the_new_version_over_its_old_weights_is_a_pin_violation(
    tiny: TinyModels, nursery: trio.Nursery, tmp_path: Path
) -> None:
    liar = await embedded_engine(
        tiny.base, nursery, name="liar", keep_old_weights=True, label_kept_weights=True
    )
    fleet = Fleet([liar])
    with pytest.raises(WeightsMismatchError) as caught:
        await fleet.pin(str(tiny.step1), "1")
    error = caught.value
    assert (error.reason, error.engine, error.expected, error.actual) == (
        "pin_violation", "liar", "1", "1"
    )
    assert await liar.weight_version() == "1"
    base = await trio.to_thread.run_sync(compute_reference, str(tiny.base))
    step1 = await trio.to_thread.run_sync(compute_reference, str(tiny.step1))
    # The embedded engine answers the prefill probe: the log-probabilities of the fixed
    # continuation, here its old weights' (the base's), against the snapshot's.
    assert error.prefill and error.reference == step1.prefill
    assert error.answer == [pytest.approx(row, abs=1e-3) for row in base.prefill]
    assert error.gap > error.margin
    rounded = [round(v, 2) for v in error.reference[error.prompt]]
    assert f"probe sequence {error.prompt}" in str(error) and str(rounded) in str(error)
    assert fleet.version is None


async def test_supervisor_skips_a_point_whose_engine_serves_other_weights_as_pin_violation(
    tiny: TinyModels, tmp_path: Path
) -> None:
    sink = MemorySink()
    honest, liar = FakeEngine("honest"), OtherWeightsEngine("liar", serves=tiny.step2)
    config = EvalConfig(hf_dir=tmp_path / "staging", pin_timeout=60.0, close_timeout=10.0)
    async with EvalSupervisor.open(
        config, eval_fn=RecordingEval(), fleet=Fleet([honest, liar]), sink=sink
    ) as sup:
        await sup.submit(1, checkpoint_dir=tiny.step1)
        await sup.submit(2, checkpoint_dir=tiny.step2)
        await sup.drain(timeout=60)
    wrong, right = sink.by_step()[1], sink.by_step()[2]
    assert (wrong.status, wrong.reason) == ("skipped", "pin_violation")
    assert "'liar'" in wrong.data["error"] and "does not serve its weights" in wrong.data["error"]
    assert right.ok


async def test_probe_off_trusts_the_version(tiny: TinyModels) -> None:
    fleet = Fleet([OtherWeightsEngine("liar", serves=tiny.step2)])
    await fleet.pin(str(tiny.step1), "1", probe=False)
    assert fleet.version == "1"


async def test_engine_without_a_completion_endpoint_is_checked_by_version_and_logged_once(
    tiny: TinyModels, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = Fleet([FakeEngine("fake")])
    with caplog.at_level(logging.WARNING, logger="actorsys.fleet"):
        for step in (1, 2, 3):
            await fleet.pin(str(tiny.step1), str(step))
    assert fleet.version == "3"
    notes = [r.getMessage() for r in caplog.records if "weight probe off" in r.getMessage()]
    assert notes == ["weight probe off: engine 'fake' has no completion endpoint; pins check "
                     "the version only"]


async def test_snapshot_without_a_config_is_checked_by_version_and_logged_once(
    tiny: TinyModels, nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = Fleet([OtherWeightsEngine("liar", serves=tiny.step2)])
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "model.safetensors").write_bytes((tiny.step1 / "model.safetensors").read_bytes())
    with caplog.at_level(logging.WARNING, logger="actorsys.fleet"):
        await fleet.pin(str(bare), "1")
        await fleet.pin(str(bare), "2")
    assert fleet.version == "2"
    notes = [r.getMessage() for r in caplog.records if "weight probe off" in r.getMessage()]
    assert len(notes) == 1 and "has no config.json" in notes[0]


async def test_server_without_generate_is_checked_by_version_and_logged_once(
    tiny: TinyModels, caplog: pytest.LogCaptureFixture
) -> None:
    version = {"value": "default"}

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/update_weights_from_disk":
            version["value"] = "1"
            return httpx.Response(200, json={"success": True})
        if request.url.path == "/model_info":
            return httpx.Response(200, json={"weight_version": version["value"]})
        if request.url.path == "/health":
            return httpx.Response(200, json={})
        return httpx.Response(404)

    recorder = Recorder(handle)
    fleet = Fleet([SGLangEngine(URL, name="old", transport=recorder.transport)])
    with caplog.at_level(logging.WARNING, logger="actorsys.fleet"):
        await fleet.pin(str(tiny.step1), "1")
    assert "POST /generate" in recorder.paths()
    notes = [r.getMessage() for r in caplog.records if "weight probe off" in r.getMessage()]
    assert len(notes) == 1 and "'old' cannot answer a token probe" in notes[0]


def synthetic_reference(rows: list[list[float]]) -> Reference:
    """One prompt whose snapshot logits at position ``i`` are ``rows[i]`` (margin 0.5)."""
    reference = reference_from_logits([[0]], torch.tensor([rows]))
    return dataclasses.replace(reference, margins=[[0.5] * len(rows)])


def test_a_near_tie_taken_the_other_way_ends_the_comparison_of_that_prompt() -> None:
    reference = synthetic_reference([[5.0, 0.0, 0.0], [4.2, 4.0, 0.0], [9.0, 0.0, 0.0]])
    assert reference.tokens == [[0, 0, 0]]
    assert first_disagreement(reference, [[0, 0, 0]]) is None
    assert first_disagreement(reference, [[0, 1, 2]]) is None
    found = first_disagreement(reference, [[0, 2, 0]])
    assert found is not None and found[:2] == (0, 1) and found[2] == pytest.approx(4.2)
    assert first_disagreement(reference, [[1, 0, 0]]) is not None


def test_probe_prompts_are_fixed_and_lie_inside_the_vocabulary() -> None:
    for vocab in (160, 32000, 151936):
        prompts = probe_prompts(vocab)
        assert prompts and all(prompts) and prompts == probe_prompts(vocab)
        high = min(vocab, 32000)
        assert all(high // 10 <= t < high for p in prompts for t in p)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_no_false_alarm_over_twenty_pins_of_random_tiny_models(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """Untied and tied-GQA engines (served in float32), pinned to snapshots stored in float32
    and in bfloat16: the probe must pass every one (the bf16 references compute in bf16)."""
    fleets = []
    for name, options in (("untied", {}), ("tied-gqa", {"tied": True, "hidden": 128, "kv_heads": 2})):
        make_model(tmp_path / name, seed=7, **options)  # type: ignore[arg-type]
        fleets.append((name, Fleet([await embedded_engine(tmp_path / name, nursery, name)])))
    for seed in range(10):
        dtype = torch.bfloat16 if seed % 2 else torch.float32
        for name, fleet in fleets:
            snapshot = tmp_path / f"{name}-{seed}"
            await trio.to_thread.run_sync(
                lambda base=tmp_path / name, path=snapshot, s=seed, d=dtype: make_snapshot(
                    base, path, seed=1000 + s, dtype=d
                )
            )
            with caplog.at_level(logging.WARNING, logger="actorsys.fleet"):
                await fleet.pin(str(snapshot), str(seed))
            assert fleet.version == str(seed)
    assert not [r for r in caplog.records if "weight probe" in r.getMessage()]


async def test_pin_deadline_abandons_a_reference_still_computing(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    entered, release = threading.Event(), threading.Event()

    async def stuck(self: ReferenceWorker, path: str, prompts: object = None) -> Reference:
        entered.set()
        await trio.to_thread.run_sync(release.wait, abandon_on_cancel=True)
        raise AssertionError("abandoned: nobody reads this")

    monkeypatch.setattr(ReferenceWorker, "compute", stuck)
    fleet = Fleet([OtherWeightsEngine("engine", serves=tiny.step1)])
    deadline = trio.move_on_after(30)

    async def pin() -> None:
        with deadline:
            await fleet.pin(str(tiny.step1), "1")

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pin)
            await trio.to_thread.run_sync(entered.wait)
            # Virtual time stands still while the reference thread runs: the test moves it.
            autojump_clock.jump(30)
        assert deadline.cancelled_caught and fleet.version is None
    finally:
        release.set()


def test_a_prefill_answer_fails_only_where_most_positions_differ_beyond_their_margin() -> None:
    reference = dataclasses.replace(
        synthetic_reference([[1.0, 0.0]]),
        prefill=[[-1.0, -2.0, -3.0, -4.0, -5.0]],
        prefill_margins=[[0.5] * 5],
    )
    near = PrefillAnswer([[-1.1, -2.2, -2.9, -4.4, -5.0]])
    one_outlier = PrefillAnswer([[-1.0, -2.0, -9.0, -4.0, -5.0]])
    other_weights = PrefillAnswer([[-3.0, -0.5, -6.0, -4.0, -1.0]])
    assert prefill_disagreement(reference, near) is None
    assert prefill_disagreement(reference, one_outlier) is None
    found = prefill_disagreement(reference, other_weights)
    assert found is not None and found[:2] == (0, 4) and found[2] == pytest.approx(4.0)
    assert prefill_disagreement(reference, PrefillAnswer([[-1.0, -2.0]])) is not None


class CountingReadBacks(OtherWeightsEngine):
    """Serves ``serves``'s weights honestly, counting its loads that ended and its version
    read-backs."""

    def __init__(self, name: str, serves: Path) -> None:
        super().__init__(name, serves)
        self.loaded = self.read_backs = 0

    async def load_weights(self, path: str, version: str) -> None:
        await super().load_weights(path, version)
        self.loaded += 1

    async def weight_version(self) -> str | None:
        self.read_backs += 1
        return await super().weight_version()


async def test_the_reference_is_computed_only_once_every_engine_read_the_version_back(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Beside the loads, the reference's forward pass would take the cores the engines load
    # with; it overlaps the evaluation instead.
    engines = [CountingReadBacks(name, serves=tiny.step1) for name in ("a", "b")]
    seen: list[list[tuple[int, int]]] = []
    compute = ReferenceWorker.compute

    async def recording(self: ReferenceWorker, path: str, prompts: object = None) -> Reference:
        seen.append([(engine.loaded, engine.read_backs) for engine in engines])
        return await compute(self, path, prompts)  # type: ignore[arg-type]

    monkeypatch.setattr(ReferenceWorker, "compute", recording)
    fleet = Fleet(engines)
    try:
        with trio.fail_after(120):
            await fleet.pin(str(tiny.step1), "1")
    finally:
        await fleet.aclose()
    assert fleet.version == "1"
    assert seen == [[(1, 1), (1, 1)]]


async def test_the_probe_reads_a_config_again_only_for_another_path(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    read = asking.read_probe_prompts

    def counted(path: str) -> list[list[int]]:
        reads.append(path)
        return read(path)

    monkeypatch.setattr(asking, "read_probe_prompts", counted)
    probe = WeightProbe()
    paths = [str(p) for p in (tiny.base, tiny.base, tiny.step1, tiny.step1, tiny.base)]
    async with trio.open_nursery() as nursery:
        answers = [await probe.prompts_beside(nursery, path).wait() for path in paths]
        assert await probe.prompts_beside(nursery, None).wait() is None
    assert reads == [paths[0], paths[2], paths[4]]
    assert all(answer == read(paths[0]) for answer in answers)

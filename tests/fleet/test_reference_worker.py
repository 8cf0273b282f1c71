"""The probe's reference out of the pinning process: a worker process computes it, so this
process never loads a model for it, never swaps transformers' process-wide state, and still
catches the engines that serve other weights under the right label (vLLM's tied head left
from the previous weights; MoE experts left unfused). A reference that fails is reported on
its point and asked again at the next pin."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest
import torch
import transformers
import trio

from actorsys import EvalConfig, EvalSupervisor, Fleet, MemorySink
from actorsys.fleet.model_load import load_causal_lm
from actorsys.fleet.pin.probe import (
    PROBE_TOKENS,
    WeightsMismatchError,
    prefill_sequences,
    read_probe_prompts,
)
from actorsys.fleet.pin.reference import ReferenceWorker
from actorsys.fleet.pin.verdict import UNVERIFIED_KEY
from tests.fakes import FakeEngine, RecordingEval
from tests.fleet.conftest import TinyModels

pytestmark = pytest.mark.timeout(300)


class AnswersWith(FakeEngine):
    """Reads back whatever version it loads and answers the probe with fixed tokens (those of
    a model computed before the test, in this process)."""

    def __init__(self, name: str, tokens: list[list[int]]) -> None:
        super().__init__(name)
        self.tokens = tokens

    async def greedy_tokens(
        self, prompts: Sequence[Sequence[int]], max_tokens: int
    ) -> list[list[int]]:
        await trio.lowlevel.checkpoint()
        return self.tokens


class PrefillWith(FakeEngine):
    """Reads back whatever version it loads and answers the prefill probe with fixed
    log-probabilities (those of a model computed before the test, in this process)."""

    def __init__(self, name: str, logprobs: list[list[float]]) -> None:
        super().__init__(name)
        self.logprobs = logprobs

    async def greedy_tokens(
        self, prompts: Sequence[Sequence[int]], max_tokens: int
    ) -> list[list[int]]:
        raise AssertionError("an engine that answers the prefill probe is not asked for tokens")

    async def prompt_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        await trio.lowlevel.checkpoint()
        return self.logprobs


def prefill_probe(model: transformers.PreTrainedModel, prompts: list[list[int]]) -> list[list[float]]:
    """``model``'s log-probabilities of the prefill probe's fixed sequences, in float32."""
    ids = torch.tensor(prefill_sequences(prompts))
    with torch.inference_mode():
        logits = model.float()(input_ids=ids, use_cache=False).logits[:, :-1, :]
    chosen = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    return chosen.tolist()


def greedy_probe(model: transformers.PreTrainedModel, prompts: list[list[int]]) -> list[list[int]]:
    """``model``'s greedy answer to the probe, in float32 as the CPU engine serves."""
    ids = torch.tensor(prompts)
    with torch.inference_mode():
        for _ in range(PROBE_TOKENS):
            logits = model.float()(input_ids=ids, use_cache=False).logits[:, -1, :]
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids[:, len(prompts[0]):].tolist()


def tied_with_old_head(models: TinyModels) -> transformers.PreTrainedModel:
    """What vLLM served after an in-place reload of a tied model: step1's body, the base
    model's head."""
    new, old = load_causal_lm(str(models.step1)), load_causal_lm(str(models.base))
    new.config.tie_word_embeddings = False
    new.lm_head.weight = torch.nn.Parameter(old.get_input_embeddings().weight.detach().clone())
    return new


def moe_with_old_experts(models: TinyModels) -> transformers.PreTrainedModel:
    """An MoE model whose experts missed the reload: step1's weights, the base's experts."""
    new, old = load_causal_lm(str(models.step1)), load_causal_lm(str(models.base))
    experts = {k: v for k, v in old.state_dict().items() if ".experts." in k}
    assert experts
    new.load_state_dict(experts, strict=False)
    return new


def honest(models: TinyModels, prompts: list[list[int]]) -> list[list[int]]:
    return greedy_probe(load_causal_lm(str(models.step1)), prompts)


@pytest.fixture
def no_model_loads_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, building a model from a checkpoint in this process fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded in the pinning process")

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(refuse))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(refuse))


@pytest.mark.parametrize("probe", ["greedy", "prefill"])
@pytest.mark.parametrize(
    ("family", "franken"), [("tied", tied_with_old_head), ("moe", moe_with_old_experts)]
)
async def test_the_reference_is_computed_out_of_process_and_catches_the_reloads_that_lie(
    family: str, franken: object, probe: str, request: pytest.FixtureRequest
) -> None:
    models: TinyModels = request.getfixturevalue(family)
    prompts = read_probe_prompts(str(models.step1))
    lying_model = franken(models)  # type: ignore[operator]
    right_model = load_causal_lm(str(models.step1))
    if probe == "greedy":
        lying, right = greedy_probe(lying_model, prompts), greedy_probe(right_model, prompts)
        liar, truthful = AnswersWith("liar", lying), AnswersWith("honest", right)
    else:
        lying, right = prefill_probe(lying_model, prompts), prefill_probe(right_model, prompts)
        liar, truthful = PrefillWith("liar", lying), PrefillWith("honest", right)
    assert lying != right
    request.getfixturevalue("no_model_loads_here")
    with pytest.raises(WeightsMismatchError) as caught:
        await Fleet([liar]).pin(str(models.step1), "1")
    assert caught.value.answer == lying and caught.value.prefill == (probe == "prefill")
    if probe == "greedy":
        assert caught.value.reference == right
    fleet = Fleet([truthful])
    await fleet.pin(str(models.step1), "1")
    assert fleet.version == "1"
    await fleet.aclose()


async def test_a_trainer_thread_loading_tied_models_always_gets_tied_models_while_pins_probe(
    tied: TinyModels,
) -> None:
    prompts = read_probe_prompts(str(tied.step1))
    fleet = Fleet([AnswersWith("honest", honest(tied, prompts))])
    stop, loads, untied = threading.Event(), [], []

    def trainer() -> None:
        while not stop.is_set():
            model = transformers.AutoModelForCausalLM.from_pretrained(str(tied.base))
            loads.append(1)
            if model.get_output_embeddings().weight is not model.get_input_embeddings().weight:
                untied.append(1)

    thread = threading.Thread(target=trainer, daemon=True)
    thread.start()
    try:
        for version in range(3):
            await fleet.pin(str(tied.step1), str(version))
    finally:
        stop.set()
        await trio.to_thread.run_sync(thread.join)
        await fleet.aclose()
    assert loads and not untied


async def test_a_failed_reference_is_reported_on_its_point_and_the_next_pin_asks_again(
    tiny: TinyModels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first worker (started when the supervisor opens) dies once asked, before it
    answers (as one killed for its memory would); the point says so in its data, and the next
    pin's reference catches the liar."""
    prompts = read_probe_prompts(str(tiny.step1))
    liar = AnswersWith("liar", greedy_probe(load_causal_lm(str(tiny.step2)), prompts))
    started: list[subprocess.Popen[bytes]] = []
    start = ReferenceWorker._start

    def start_dying_first(self: ReferenceWorker) -> subprocess.Popen[bytes]:
        if not started:
            process = subprocess.Popen(
                [sys.executable, "-c", "import sys; sys.stdin.buffer.read(8); sys.exit(9)"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            )
        else:
            process = start(self)
        started.append(process)
        return process

    monkeypatch.setattr(ReferenceWorker, "_start", start_dying_first)
    sink = MemorySink()
    config = EvalConfig(hf_dir=tmp_path / "staging", pin_timeout=120.0, close_timeout=10.0)
    async with EvalSupervisor.open(
        config, eval_fn=RecordingEval(), fleet=Fleet([liar]), sink=sink
    ) as sup:
        await sup.submit(1, checkpoint_dir=tiny.step1)
        await sup.drain(timeout=120)
        await sup.submit(2, checkpoint_dir=tiny.step1)
        await sup.drain(timeout=120)
        assert started[-1].poll() is None
    unchecked, caught = sink.by_step()[1], sink.by_step()[2]
    assert unchecked.ok
    assert "not checked" in unchecked.data[UNVERIFIED_KEY]
    assert "exited (status 9)" in unchecked.data[UNVERIFIED_KEY]
    assert (caught.status, caught.reason) == ("skipped", "pin_violation")
    assert len(started) == 2 and all(p.poll() is not None for p in started)


async def test_a_cancelled_reference_kills_its_worker(tiny: TinyModels) -> None:
    worker = ReferenceWorker()
    prompts = read_probe_prompts(str(tiny.step1))
    await worker.compute(str(tiny.step1), prompts)
    pid = worker.pid
    assert pid is not None
    with trio.move_on_after(0.01):
        await worker.compute(str(tiny.step2), prompts)
    assert worker.pid is None
    reference = await worker.compute(str(tiny.step2), prompts)
    assert worker.pid not in (None, pid) and reference.prompts == prompts
    await worker.aclose()
    assert worker.pid is None and worker.started == 2


async def test_a_worker_whose_owner_is_collected_is_killed(tiny: TinyModels) -> None:
    worker = ReferenceWorker()
    await worker.compute(str(tiny.step1), read_probe_prompts(str(tiny.step1)))
    process = psutil.Process(worker.pid)
    del worker
    gc.collect()
    assert await trio.to_thread.run_sync(lambda: process.wait(timeout=10)) == -9

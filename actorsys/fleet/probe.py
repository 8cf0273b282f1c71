"""The weight probe: after a pin, every engine must compute what the snapshot computes.

A version read back is a label, not proof: vLLM's in-place reload of a model with tied
embeddings labels the new version while it serves the new body with the old head (see
``actorsys/fleet/vllm_worker``). So, once every engine reads back the version, each answers a
short fixed probe (``PROBE_PROMPTS`` prompts of ``PROMPT_TOKENS`` token ids, ``PROBE_TOKENS``
greedy tokens, penalties off) and its tokens are compared with the snapshot's own greedy
continuation, computed here with transformers.

Kernel numerics differ between engines and dtypes, so a token counts as wrong only where the
snapshot clearly prefers its own choice: the engine's token must be within ``margin`` of the
snapshot's best at that position, ``margin = REL_MARGIN * std(logits) + ABS_MARGIN`` of the
snapshot's logits there. Where an engine takes another token within the margin (a near-tie)
the two continuations part ways and the rest of that prompt is not compared. Weights that
are not the snapshot's pick tokens the snapshot puts several standard deviations below its
best, at almost every position.

The reference costs no second copy of the weights: transformers maps the snapshot's
safetensors files and computes on the mapped pages (measured: anonymous memory unchanged
loading a 237 MB fp32 checkpoint; the pages are the page cache's). It runs in a worker thread,
one per fleet at a time, started with the engines' loads so that it overlaps them, and it is
off the pin's critical path: the probe's prompts need only the snapshot's ``config.json``, so
the engines answer them as soon as they read the version back, and the answers are judged
against the reference when it is ready (see :meth:`actorsys.Fleet.pin_and_verify`).

An engine that cannot answer a probe (no ``greedy_tokens``, as an in-process ``Engine`` that
implements just the protocol; or a server without the endpoint), or a snapshot without a
``config.json``, is checked by its version only, and the fleet logs why once.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import trio

from actorsys._errors import ActorsysError
from actorsys.fleet.errors import (
    EngineUnhealthyError,
    Named,
    PinError,
    PinViolationError,
    on_all,
)
from actorsys.fleet.model_load import load_causal_lm
from actorsys.runtime import ThreadTracker, run_blocking

log = logging.getLogger("actorsys.fleet")

PROBE_PROMPTS = 4
PROMPT_TOKENS = 8
PROBE_TOKENS = 6
REL_MARGIN = 0.5
ABS_MARGIN = 1e-3
PROBE_SEED = 20261201

PROBE_SAMPLING = {
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "ignore_eos": True,
}
"""Sampling parameters of the weight probe: greedy, every penalty off (a model's generation
config may set some by default), end-of-sequence ignored."""


class ProbeUnsupportedError(ActorsysError):
    """The engine has no way to answer a token probe (the pin then checks the version only)."""


class ReferenceUnavailableError(ActorsysError):
    """The snapshot cannot give the probe's answer (the pin then checks the version only)."""


@runtime_checkable
class ProbedEngine(Protocol):
    """An engine that can answer the weight probe."""

    name: str

    async def greedy_tokens(
        self, prompts: Sequence[Sequence[int]], max_tokens: int
    ) -> list[list[int]]:
        """The ``max_tokens`` greedy token ids that follow each prompt (given as token ids),
        at temperature 0, with every penalty off and end-of-sequence ignored. Raises
        :class:`ProbeUnsupportedError` if the server has no endpoint for it."""
        ...


class WeightsMismatchError(PinViolationError):
    """An engine reads back the right version but computes something the snapshot does not.

    ``answer`` is the engine's greedy tokens for each probe prompt, ``reference`` the
    snapshot's; ``prompt`` and ``position`` locate the first clear disagreement, ``gap`` is
    how far (in log-probability) the snapshot puts the engine's token below its own choice
    there, and ``margin`` what a near-tie may be.
    """

    def __init__(
        self,
        engine: str,
        version: str,
        *,
        answer: list[list[int]],
        reference: list[list[int]],
        prompt: int,
        position: int,
        gap: float,
        margin: float,
    ) -> None:
        PinError.__init__(
            self,
            engine,
            f"reads back version {version!r} but does not serve its weights: probe prompt "
            f"{prompt}, token {position}: the engine answered {answer[prompt]}, the snapshot "
            f"answers {reference[prompt]} (the engine's token is {gap:.3g} below the "
            f"snapshot's choice in log-probability; a near-tie is within {margin:.3g})",
        )
        self.expected = version
        self.actual = version
        self.answer = answer
        self.reference = reference
        self.prompt = prompt
        self.position = position
        self.gap = gap
        self.margin = margin


@dataclass(frozen=True)
class Reference:
    """The snapshot's greedy answer to the probe and, per prompt and position, its
    log-probabilities (``logprobs[p][i]``, one per token id) and near-tie margin."""

    prompts: list[list[int]]
    tokens: list[list[int]]
    logprobs: Any
    margins: list[list[float]]


def probe_prompts(vocab_size: int) -> list[list[int]]:
    """The fixed probe prompts for a vocabulary: token ids drawn with a fixed seed from the
    lower part of the vocabulary, where every tokenizer has ordinary tokens (special tokens
    sit at its ends)."""
    high = min(vocab_size, 32000)
    low = high // 10
    rng = random.Random(PROBE_SEED)
    return [[rng.randrange(low, high) for _ in range(PROMPT_TOKENS)] for _ in range(PROBE_PROMPTS)]


def read_probe_prompts(path: str) -> list[list[int]]:
    """The probe prompts for the snapshot at ``path``, from the vocabulary size in its
    ``config.json`` (or its ``text_config``). Raises :class:`ReferenceUnavailableError`
    where there is no readable config or no vocabulary size. Blocking: reads one small file."""
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise ReferenceUnavailableError(f"the snapshot {path} has no config.json")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise ReferenceUnavailableError(f"the config of the snapshot {path} is unreadable: {exc}") from exc
    for section in (config, config.get("text_config")) if isinstance(config, dict) else ():
        vocab = section.get("vocab_size") if isinstance(section, dict) else None
        if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0:
            return probe_prompts(vocab)
    raise ReferenceUnavailableError(f"the config of the snapshot {path} names no vocab_size")


def compute_reference(path: str, prompts: list[list[int]] | None = None) -> Reference:
    """What the snapshot at ``path`` answers to the probe (``prompts``, default: those of its
    vocabulary). Raises :class:`ReferenceUnavailableError` where there is no ``config.json``
    or transformers cannot build the model. Blocking: maps the weights and runs
    ``PROBE_TOKENS`` forward passes of a ``PROBE_PROMPTS`` batch in the snapshot's own
    dtype."""
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ReferenceUnavailableError(f"the snapshot {path} has no config.json")
    import torch
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model = load_causal_lm(path, dtype="auto")
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ReferenceUnavailableError(f"transformers cannot build the snapshot {path}: {exc}") from exc
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    model.eval()
    if prompts is None:
        prompts = probe_prompts(int(model.config.vocab_size))
    ids = torch.tensor(prompts, dtype=torch.long)
    steps = []
    with torch.inference_mode():
        for _ in range(PROBE_TOKENS):
            logits = model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[:, -1, :]
            steps.append(logits.float())
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    logits = torch.stack(steps, dim=1)
    margins = REL_MARGIN * logits.std(dim=-1) + ABS_MARGIN
    return Reference(
        prompts=prompts,
        tokens=ids[:, PROMPT_TOKENS:].tolist(),
        logprobs=torch.log_softmax(logits, dim=-1),
        margins=margins.tolist(),
    )


def first_disagreement(
    reference: Reference, answer: list[list[int]]
) -> tuple[int, int, float, float] | None:
    """The first (prompt, position, gap, margin) where ``answer`` takes a token the snapshot
    puts more than the margin below its own choice; None if there is none."""
    for p, (ours, theirs) in enumerate(zip(reference.tokens, answer, strict=True)):
        for i, (mine, token) in enumerate(zip(ours, theirs, strict=False)):
            if mine == token:
                continue
            row = reference.logprobs[p, i]
            if not 0 <= token < row.shape[0]:
                return p, i, float("inf"), reference.margins[p][i]
            gap = float(row[mine] - row[token])
            if gap > reference.margins[p][i]:
                return p, i, gap, reference.margins[p][i]
            break
    return None


class WeightProbe:
    """The probe state of one fleet: the limiter of its reference thread and the reasons
    already logged for checking only the version.

    A pin uses it in three steps: :meth:`prompts` (before the loads), :meth:`reference` (in
    a task of its own, while the engines load and answer) and :meth:`ask` (once they read
    the version back), then :func:`judge` the answers against the reference.
    """

    def __init__(self) -> None:
        self.limiter = trio.CapacityLimiter(1)
        self.tracker = ThreadTracker()
        self._files = trio.CapacityLimiter(1)
        self._logged: set[str] = set()

    def note_once(self, reason: str) -> None:
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning("weight probe off: %s; pins check the version only", reason)

    def probed(self, engines: Sequence[Named]) -> list[ProbedEngine]:
        """The engines that can be probed; logs once for each that cannot."""
        probed: list[ProbedEngine] = []
        for engine in engines:
            if isinstance(engine, ProbedEngine):
                probed.append(engine)
            else:
                self.note_once(f"engine {engine.name!r} has no completion endpoint")
        return probed

    async def prompts(self, path: str) -> list[list[int]] | None:
        """The probe prompts of the snapshot at ``path`` (its ``config.json``, read in a worker
        thread); None, logged once, where it has none."""
        try:
            return await run_blocking(
                lambda: read_probe_prompts(path),
                abandon_on_cancel=True,
                limiter=self._files,
                description=f"weight probe prompts of {path}",
                tracker=self.tracker,
            )
        except ReferenceUnavailableError as exc:
            self.note_once(str(exc))
            return None

    async def reference(self, path: str, prompts: list[list[int]] | None = None) -> Reference | None:
        """The snapshot's answer, computed in a worker thread (abandoned on cancel: it only
        reads). None, logged once, where the snapshot cannot give one or computing it
        failed (a fault of the probe never fails a pin by itself)."""
        try:
            return await run_blocking(
                lambda: compute_reference(path, prompts),
                abandon_on_cancel=True,
                limiter=self.limiter,
                description=f"weight probe reference of {path}",
                tracker=self.tracker,
            )
        except ReferenceUnavailableError as exc:
            self.note_once(str(exc))
        except Exception as exc:
            log.exception("weight probe: computing the reference of %s failed", path)
            self.note_once(f"computing the snapshot's answer failed: {exc!r}")
        return None

    async def ask(
        self, engines: Sequence[ProbedEngine], prompts: list[list[int]]
    ) -> list[list[list[int]] | None]:
        """Every engine's greedy answer to ``prompts``, asked concurrently (None for one
        that cannot answer a token probe, logged once). Raises :class:`EngineUnhealthyError`
        for an engine whose request fails or that answers the wrong number of prompts."""

        async def one(engine: ProbedEngine) -> list[list[int]] | None:
            try:
                answer = await engine.greedy_tokens(prompts, PROBE_TOKENS)
            except ProbeUnsupportedError as exc:
                self.note_once(f"engine {engine.name!r} cannot answer a token probe ({exc})")
                return None
            if len(answer) != len(prompts):
                raise EngineUnhealthyError(
                    engine.name, f"answered {len(answer)} of {len(prompts)} probes"
                )
            return answer

        return await on_all(engines, one, "could not answer the probe")


def judge(
    engines: Sequence[Named],
    answers: Sequence[list[list[int]] | None],
    reference: Reference,
    version: str,
) -> WeightsMismatchError | None:
    """The error of the first engine whose answer the snapshot clearly disagrees with; None
    if every answer (None: an engine not probed) agrees. Pure: runs on the caller's thread
    (a few hundred comparisons)."""
    for engine, answer in zip(engines, answers, strict=True):
        if answer is None:
            continue
        found = first_disagreement(reference, answer)
        if found is not None:
            prompt, position, gap, margin = found
            return WeightsMismatchError(
                engine.name,
                version,
                answer=answer,
                reference=reference.tokens,
                prompt=prompt,
                position=position,
                gap=gap,
                margin=margin,
            )
    return None

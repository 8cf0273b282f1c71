"""The weight probe: after a pin, every engine must compute what the snapshot computes.

A version read back is a label, not proof: vLLM's in-place reload of a model with tied
embeddings labels the new version while it serves the new body with the old head, and of an
MoE model, while it serves experts packed from the previous weights (see
``actorsys/fleet/vllm_worker``). So, once every engine reads back the version, each answers a
short fixed probe, compared with what the snapshot itself computes (transformers, in a
worker process).

The probe is one prefill where the engine can answer it (:class:`PrefillEngine`: the CPU
engine and vLLM, through completions with ``echo`` and ``logprobs``): the log-probabilities
of ``PROBE_PROMPTS`` fixed sequences (:func:`probe_sequence`: ``PROMPT_TOKENS`` prompt token
ids and ``PROBE_TOKENS`` fixed continuation tokens), one forward pass and no decoding. Each
position may differ from the snapshot's by its margin (below); the answer is wrong where the
median difference over all positions exceeds it, which numerics never reach and other weights
always do. Engines that cannot answer a prefill answer ``PROBE_TOKENS`` greedy tokens after
each prompt (penalties off), compared with the snapshot's greedy continuation as follows.

Kernel numerics differ between engines and dtypes, so a token counts as wrong only where the
snapshot clearly prefers its own choice: the engine's token must be within ``margin`` of the
snapshot's best at that position, ``margin = REL_MARGIN * std(logits) + ABS_MARGIN`` of the
snapshot's logits there (``HALF_PRECISION_REL_MARGIN`` instead of ``REL_MARGIN`` for a
snapshot in a 16-bit dtype: the tolerance follows the precision the weights carry).
Where an engine takes another token within the margin (a near-tie)
the two continuations part ways and the rest of that prompt is not compared. Weights that
are not the snapshot's pick tokens the snapshot puts several standard deviations below its
best, at almost every position.

The reference is computed out of the pinning process, by a reference worker
(:mod:`actorsys.fleet.reference`): the trainer's process never maps the snapshot, never runs
its forward and never swaps transformers' process-wide state for it. The worker maps the
snapshot's safetensors files and computes on the mapped pages. It runs one reference at a
time, started with the engines' loads so that it overlaps them, and it is off the pin's
critical path: the probe's prompts need only the snapshot's ``config.json``, so the engines
answer them as soon as they read the version back, and the answers are judged against the
reference when it is ready (see :meth:`actorsys.Fleet.pin_and_verify`). A reference that
fails (the worker crashed or ran out of memory) leaves that pin checked by version only, says
so on its verdict (``PinVerdict.unverified``, and so on the point's data), and the next pin
asks again: a failure never turns the probe off.

An engine that cannot answer a probe (no ``greedy_tokens``, as an in-process ``Engine`` that
implements just the protocol; or a server without the endpoint), or a snapshot without a
``config.json``, is checked by its version only, and the fleet logs why once.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
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
HALF_PRECISION_REL_MARGIN = 1.5
"""The relative margin where the snapshot's weights are 16-bit floats: the reference then
computes in that dtype and an engine may serve in another (float32 on the CPU engine), and
their logits differ by the rounding of 8 (bfloat16) or 11 (float16) significant bits at
every layer, measured up to about one standard deviation of the logits on tiny random
models."""
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
    """The snapshot has no config to take the probe's prompts from (the pin then checks the
    version only)."""


class ReferenceFailedError(ActorsysError):
    """The snapshot's answer could not be computed this time (the reference worker crashed or
    ran out of memory, or transformers failed on the snapshot). The pin reports it on its
    verdict (``PinVerdict.unverified``), and the next pin asks again."""


class ReferenceSource(Protocol):
    """Where a pin gets the snapshot's answer: :class:`actorsys.fleet.reference.ReferenceWorker`,
    a worker process (never the pinning process itself)."""

    async def compute(self, path: str, prompts: list[list[int]]) -> Reference:
        """The snapshot's answer to ``prompts``; raises :class:`ReferenceFailedError`."""
        ...


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


@runtime_checkable
class PrefillEngine(Protocol):
    """An engine that can answer the weight probe in one prefill: the log-probabilities of a
    fixed continuation (OpenAI completions with ``echo`` and ``logprobs``)."""

    name: str

    async def prompt_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """For each sequence (token ids), the log-probability of every token after the first
        given those before it (``len(sequence) - 1`` values), with no token generated.
        Raises :class:`ProbeUnsupportedError` if the server cannot answer that (the probe
        then asks for greedy tokens)."""
        ...


@dataclass(frozen=True)
class PrefillAnswer:
    """An engine's answer to the prefill probe: ``logprobs[p][t]`` for the sequence ``p``'s
    token ``t + 1``."""

    logprobs: list[list[float]]


Answer = list[list[int]] | PrefillAnswer
"""An engine's answer to the probe: its greedy tokens per prompt, or a prefill's log-probabilities."""


class WeightsMismatchError(PinViolationError):
    """An engine reads back the right version but computes something the snapshot does not.

    ``answer`` is the engine's greedy tokens for each probe prompt, ``reference`` the
    snapshot's; ``prompt`` and ``position`` locate the first clear disagreement, ``gap`` is
    how far (in log-probability) the snapshot puts the engine's token below its own choice
    there, and ``margin`` what a near-tie may be. For an engine probed by prefill
    (``prefill``), ``answer`` and ``reference`` are the log-probabilities of the fixed
    continuation, and ``prompt``, ``position``, ``gap`` locate their widest difference.
    """

    def __init__(
        self,
        engine: str,
        version: str,
        *,
        answer: list[list[int]] | list[list[float]],
        reference: list[list[int]] | list[list[float]],
        prompt: int,
        position: int,
        gap: float,
        margin: float,
        prefill: bool = False,
    ) -> None:
        if prefill:
            detail = (
                f"probe sequence {prompt}: the engine's log-probabilities of the fixed "
                f"continuation {_rounded(answer[prompt])}, the snapshot's "
                f"{_rounded(reference[prompt])} (token {position} differs by {gap:.3g}; "
                f"numerics may move one by {margin:.3g})"
            )
        else:
            detail = (
                f"probe prompt {prompt}, token {position}: the engine answered "
                f"{answer[prompt]}, the snapshot answers {reference[prompt]} (the engine's "
                f"token is {gap:.3g} below the snapshot's choice in log-probability; a "
                f"near-tie is within {margin:.3g})"
            )
        PinError.__init__(
            self,
            engine,
            f"reads back version {version!r} but does not serve its weights: {detail}",
        )
        self.prefill = prefill
        self.expected = version
        self.actual = version
        self.answer = answer
        self.reference = reference
        self.prompt = prompt
        self.position = position
        self.gap = gap
        self.margin = margin


def _rounded(values: Sequence[float | int]) -> list[float | int]:
    return [round(v, 2) if isinstance(v, float) else v for v in values]


NEAR_TOKENS = 16
"""Besides every near-tie, the reference keeps the gaps of this many best tokens per position
(so a mismatch reports the exact gap of a token the snapshot ranks among its first few)."""
NEAR_CAP = 4096
"""At most this many tokens per position are kept (a flatter distribution than that is
undecidable past them, and treated as a near-tie)."""


@dataclass(frozen=True)
class Reference:
    """The snapshot's greedy answer to the probe, small and free of torch (it travels from
    the reference worker by pickle): per prompt ``p`` and position ``i``, ``gaps[p][i]`` maps
    each token the snapshot ranks close to its choice (every near-tie, and the
    ``NEAR_TOKENS`` best) to how far below its choice it lies in log-probability, ``floors[p][i]``
    is a lower bound of the gap of every token not listed, and ``margins[p][i]`` is the
    near-tie margin there. ``prefill`` and ``prefill_margins`` are the same for the prefill
    probe: the log-probability of each token of the fixed sequence, and how far numerics may
    move it."""

    prompts: list[list[int]]
    tokens: list[list[int]]
    gaps: list[list[dict[int, float]]]
    floors: list[list[float]]
    margins: list[list[float]]
    vocab_size: int
    prefill: list[list[float]] = field(default_factory=list)
    """The log-probabilities of each :func:`probe_sequence` token after the first (empty
    where not computed)."""
    prefill_margins: list[list[float]] = field(default_factory=list)


def reference_from_logits(
    prompts: list[list[int]], logits: Any, *, rel_margin: float = REL_MARGIN
) -> Reference:
    """The :class:`Reference` of the snapshot logits ``logits`` (a float tensor of shape
    (prompts, positions, vocabulary)), whose argmax at each position is the snapshot's
    choice; ``rel_margin`` times the standard deviation of the logits is a near-tie."""
    import torch

    logprobs = torch.log_softmax(logits.float(), dim=-1)
    margins = rel_margin * logits.float().std(dim=-1) + ABS_MARGIN
    vocab = int(logprobs.shape[-1])
    keep = min(vocab, NEAR_CAP)
    best, order = logprobs.topk(keep, dim=-1)
    tokens: list[list[int]] = []
    gaps: list[list[dict[int, float]]] = []
    floors: list[list[float]] = []
    for p in range(logprobs.shape[0]):
        tokens.append([])
        gaps.append([])
        floors.append([])
        for i in range(logprobs.shape[1]):
            row_gaps = (best[p, i, 0] - best[p, i]).tolist()
            row_tokens = order[p, i].tolist()
            margin = float(margins[p, i])
            kept = {}
            for rank, (token, gap) in enumerate(zip(row_tokens, row_gaps, strict=True)):
                if rank >= NEAR_TOKENS and gap > margin:
                    floors[p].append(gap)
                    break
                kept[token] = gap
            else:
                floors[p].append(math.inf if keep == vocab else row_gaps[-1])
            tokens[p].append(row_tokens[0])
            gaps[p].append(kept)
    return Reference(
        prompts=[list(prompt) for prompt in prompts],
        tokens=tokens,
        gaps=gaps,
        floors=floors,
        margins=margins.tolist(),
        vocab_size=vocab,
    )


def probe_prompts(vocab_size: int) -> list[list[int]]:
    """The fixed probe prompts for a vocabulary: token ids drawn with a fixed seed from the
    lower part of the vocabulary, where every tokenizer has ordinary tokens (special tokens
    sit at its ends)."""
    high = min(vocab_size, 32000)
    low = high // 10
    rng = random.Random(PROBE_SEED)
    return [[rng.randrange(low, high) for _ in range(PROMPT_TOKENS)] for _ in range(PROBE_PROMPTS)]


def probe_sequence(prompt: Sequence[int]) -> list[int]:
    """The prefill probe's fixed sequence for one probe prompt: the prompt, then
    ``PROBE_TOKENS`` fixed tokens (the prompt's own, reversed: inside the vocabulary, and
    continuations no model favours, so every position tells)."""
    return [*prompt, *list(reversed(prompt))[:PROBE_TOKENS]]


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
    dtype, in the calling process: the pipeline calls it only in the reference worker
    (:mod:`actorsys.fleet.reference`), never in the trainer's process."""
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
        sequences = torch.tensor([probe_sequence(p) for p in prompts], dtype=torch.long)
        full = model(input_ids=sequences, use_cache=False).logits[:, :-1, :].float()
    half = model.dtype in (torch.bfloat16, torch.float16)
    del model
    rel_margin = HALF_PRECISION_REL_MARGIN if half else REL_MARGIN
    reference = reference_from_logits(prompts, torch.stack(steps, dim=1), rel_margin=rel_margin)
    chosen = torch.log_softmax(full, dim=-1).gather(-1, sequences[:, 1:, None])[..., 0]
    return dataclasses.replace(
        reference,
        prefill=chosen.tolist(),
        prefill_margins=(rel_margin * full.std(dim=-1) + ABS_MARGIN).tolist(),
    )


def prefill_disagreement(
    reference: Reference, answer: PrefillAnswer
) -> tuple[int, int, float, float] | None:
    """Where the prefill ``answer`` differs from the snapshot's: None where the typical
    (median) difference over every position is within its margin; else the (sequence,
    position, difference, margin) of the widest. Numerics move a few positions by a margin's
    worth (more in 16-bit dtypes), other weights move almost all of them by several."""
    ratios: list[tuple[float, int, int, float, float]] = []
    for p, (ours, theirs) in enumerate(zip(reference.prefill, answer.logprobs, strict=True)):
        if len(theirs) != len(ours):
            return p, min(len(ours), len(theirs)), math.inf, 0.0
        for t, (mine, value) in enumerate(zip(ours, theirs, strict=True)):
            margin = reference.prefill_margins[p][t]
            gap = abs(mine - value) if math.isfinite(value) else math.inf
            ratios.append((gap / margin, p, t, gap, margin))
    if not ratios or statistics.median(r[0] for r in ratios) <= 1.0:
        return None
    _, p, t, gap, margin = max(ratios)
    return p, t, gap, margin


def first_disagreement(
    reference: Reference, answer: list[list[int]]
) -> tuple[int, int, float, float] | None:
    """The first (prompt, position, gap, margin) where ``answer`` takes a token the snapshot
    puts more than the margin below its own choice; None if there is none. ``gap`` is a
    lower bound where the token is not among those the reference lists."""
    for p, (ours, theirs) in enumerate(zip(reference.tokens, answer, strict=True)):
        for i, (mine, token) in enumerate(zip(ours, theirs, strict=False)):
            if mine == token:
                continue
            margin = reference.margins[p][i]
            if not 0 <= token < reference.vocab_size:
                return p, i, math.inf, margin
            gap = reference.gaps[p][i].get(token, reference.floors[p][i])
            if gap > margin:
                return p, i, gap, margin
            break
    return None


class WeightProbe:
    """The probe state of one fleet: the reasons already logged for checking only the
    version.

    A pin uses it in three steps: :meth:`prompts` (before the loads), :meth:`reference` (in
    a task of its own, while the engines load and answer) and :meth:`ask` (once they read
    the version back), then :func:`judge` the answers against the reference.
    """

    def __init__(self) -> None:
        self.tracker = ThreadTracker()
        self._files = trio.CapacityLimiter(1)
        self._logged: set[str] = set()

    def note_once(self, reason: str, *, off: bool = True) -> None:
        if reason not in self._logged:
            self._logged.add(reason)
            if off:
                log.warning("weight probe off: %s; pins check the version only", reason)
            else:
                log.info("weight probe: %s", reason)

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

    async def reference(
        self, source: ReferenceSource, path: str, prompts: list[list[int]]
    ) -> Reference | ReferenceFailedError:
        """The snapshot's answer, from ``source`` (cancellable). A failure is returned, and
        logged each time: the pin reports it on its point, and the next pin asks again (a
        fault of the reference never fails a pin by itself, and never turns the probe
        off)."""
        try:
            return await source.compute(path, prompts)
        except ReferenceFailedError as exc:
            failure = exc
        except Exception as exc:
            failure = ReferenceFailedError(f"computing the answer of {path} failed: {exc!r}")
        log.warning(
            "weight probe: no reference for %s (%s); this pin is checked by version only, "
            "the next pin asks again", path, failure,
        )
        return failure

    async def ask(
        self, engines: Sequence[ProbedEngine], prompts: list[list[int]]
    ) -> list[Answer | None]:
        """Every engine's answer to the probe, asked concurrently: one prefill of the fixed
        sequences (:func:`probe_sequence`) where the engine can answer it, else its greedy
        tokens after ``prompts`` (None for one that can answer neither, logged once).
        Raises :class:`EngineUnhealthyError` for an engine whose request fails or that
        answers the wrong number of prompts."""
        sequences = [probe_sequence(p) for p in prompts]

        async def one(engine: ProbedEngine) -> Answer | None:
            if isinstance(engine, PrefillEngine):
                try:
                    logprobs = await engine.prompt_logprobs(sequences)
                except ProbeUnsupportedError as exc:
                    self.note_once(f"engine {engine.name!r} cannot answer a prefill probe "
                                   f"({exc}); it is asked for greedy tokens", off=False)
                else:
                    if len(logprobs) != len(sequences):
                        raise EngineUnhealthyError(
                            engine.name, f"answered {len(logprobs)} of {len(sequences)} probes"
                        )
                    return PrefillAnswer([[float(v) for v in row] for row in logprobs])
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
    answers: Sequence[Answer | None],
    reference: Reference,
    version: str,
) -> WeightsMismatchError | None:
    """The error of the first engine whose answer the snapshot clearly disagrees with; None
    if every answer (None: an engine not probed) agrees. Pure: runs on the caller's thread
    (a few hundred comparisons)."""
    for engine, answer in zip(engines, answers, strict=True):
        if answer is None:
            continue
        if isinstance(answer, PrefillAnswer):
            found = prefill_disagreement(reference, answer)
            if found is not None:
                prompt, position, gap, margin = found
                return WeightsMismatchError(
                    engine.name, version, answer=answer.logprobs, reference=reference.prefill,
                    prompt=prompt, position=position, gap=gap, margin=margin, prefill=True,
                )
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

"""The model an embedded engine serves: loading, swapping weights, batched generation.

Everything here is blocking and not thread-safe; the server calls it from one worker thread
at a time (a lock serialises generation batches and weight loads), so a batch never sees two
checkpoints and each answer carries the version of the weights that produced it.
"""

from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import DynamicCache

from actorsys._errors import ConfigError
from actorsys.fleet.chat_template import load_tokenizer
from actorsys.fleet.checkpoint import (
    CheckpointMismatchError,
    check_checkpoint,
    read_config,
    read_tensor_infos,
    weight_files,
)
from actorsys.fleet.embedded.logprobs import TokenLogprob, at_position, score_prompts
from actorsys.fleet.model_load import load_causal_lm

INITIAL_VERSION = "default"


@dataclass(frozen=True)
class GenerationRequest:
    """One sequence to continue. ``temperature == 0`` is greedy; ``seed`` makes sampling
    repeatable; ``top_k`` (None: off) samples among the most likely tokens only. Generation
    ends at the first of ``stop`` that appears in the decoded text. ``logprobs`` (top-k count)
    asks for the log-probabilities of the generated tokens, and with ``echo`` of the prompt's
    tokens too."""

    input_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    echo: bool = False


@dataclass(frozen=True)
class GenerationResult:
    """``prompt_logprobs`` is set for ``echo`` requests with ``logprobs``, ``output_logprobs``
    for requests with ``logprobs`` (one per output token)."""

    output_ids: list[int]
    finish_reason: str
    weight_version: str
    prompt_logprobs: list[TokenLogprob] | None = None
    output_logprobs: list[TokenLogprob] | None = None


class ModelHost:
    """A transformers causal LM in float32 on the CPU, its tokenizer and its version label.

    ``keep_old_weights`` is for tests only: ``load`` then checks and reports success but keeps
    the weights and the version it had, like an engine that silently ignores updates; with
    ``label_kept_weights`` as well, it takes the new version label but keeps the weights,
    like vLLM reloading a model with tied embeddings (only the weight probe can tell).
    """

    def __init__(
        self, model_dir: str, *, keep_old_weights: bool = False, label_kept_weights: bool = False
    ) -> None:
        self.model_dir = os.path.abspath(model_dir)
        if not os.path.isdir(self.model_dir):
            # Never a name on a model hub: transformers would go and ask one for it.
            raise ConfigError("ModelHost(model_dir)", f"no model directory at {self.model_dir} "
                              "(a model is read from a local directory, never downloaded)")
        # Its tokenizer files must lie in it, as a loaded snapshot's (``watch`` starts its
        # engines on the first checkpoint it finds): a CheckpointMismatchError names the link.
        self.tokenizer = load_tokenizer(self.model_dir)
        self.model = _load_model(self.model_dir)
        self.config = read_config(self.model_dir)
        self.tensors = read_tensor_infos(self.model_dir)
        self.keep_old_weights = keep_old_weights
        self.label_kept_weights = label_kept_weights
        self._model_keys = frozenset(self.model.state_dict())
        self.version = INITIAL_VERSION
        self.model_path = self.model_dir
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 2048))
        self.vocab_size = int(self.model.config.vocab_size)
        self.eos_ids = _eos_ids(self.model)
        self.generation_max_tokens = _generation_max_tokens(self.model)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (min(self.eos_ids) if self.eos_ids else 0))
        parameters = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"

    def check(self, path: str, *, require_complete: bool) -> None:
        """Check that checkpoint ``path`` can replace the served weights (reads headers only,
        never waits on a file: :func:`~actorsys.fleet.checkpoint.check_checkpoint`). Raises
        :class:`CheckpointMismatchError`. Touches nothing of the served model, so it runs
        beside generation."""
        check_checkpoint(
            os.path.abspath(path),
            require_complete=require_complete,
            served_config=self.config,
            served_tensors=self.tensors,
        )

    def load(self, path: str, version: str | None, *, require_complete: bool) -> None:
        """Replace the weights with those of checkpoint ``path`` and label them ``version``
        (None keeps the label).

        Raises :class:`CheckpointMismatchError` if ``path`` is missing, incomplete where
        required, corrupt, or of another architecture; the served weights are then unchanged,
        because every tensor is read and checked before any is copied in.

        The checkpoint's tensors are copied into the served model by name where every one of
        them names a tensor of the model. Where some do not, transformers converted them at
        load (mixture-of-experts models: the per-expert tensors of the checkpoint are fused
        into one tensor per layer), and a copy by name would miss them: the model is then
        loaded afresh from ``path`` by transformers, through the same conversions, and
        replaces the served one (for a moment both are in memory).
        """
        path = os.path.abspath(path)
        check_checkpoint(
            path,
            require_complete=require_complete,
            served_config=self.config,
            served_tensors=self.tensors,
        )
        state: dict[str, torch.Tensor] = {}
        try:
            for file in weight_files(path):
                state.update(load_file(file))
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointMismatchError(path, f"weights unreadable: {exc}") from exc
        if self.keep_old_weights:
            if self.label_kept_weights and version is not None:
                self.version = version
            return
        if state.keys() <= self._model_keys:
            with torch.no_grad():
                self.model.load_state_dict(state, strict=False)
        else:
            del state
            self.model = _load_model(path)
        self.model_path = path
        if version is not None:
            self.version = version

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def token_text(self, token_id: int) -> str:
        """One token as text, special tokens included (the ``tokens`` of a logprobs answer)."""
        return str(self.tokenizer.decode([token_id], skip_special_tokens=False))

    @torch.inference_mode()
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Continue every request in one left-padded batch with a shared KV cache; score the
        prompts of ``echo`` requests that ask for ``logprobs``, one forward pass for those of
        one length and top-k."""
        if not requests:
            return []
        prompt_logprobs: list[list[TokenLogprob] | None] = [None] * len(requests)
        groups: dict[tuple[int, int], list[int]] = {}
        for index, r in enumerate(requests):
            if r.echo and r.logprobs is not None:
                groups.setdefault((len(r.input_ids), r.logprobs), []).append(index)
        for (_, k), members in groups.items():
            scored = score_prompts(self.model, [requests[i].input_ids for i in members], k)
            for index, one in zip(members, scored, strict=True):
                prompt_logprobs[index] = one
        outputs, reasons, output_logprobs = self._continue(requests)
        return [
            GenerationResult(
                output_ids=out,
                finish_reason=reason,
                weight_version=self.version,
                prompt_logprobs=scored,
                output_logprobs=logprobs,
            )
            for out, reason, scored, logprobs in zip(
                outputs, reasons, prompt_logprobs, output_logprobs, strict=True
            )
        ]

    def _continue(
        self, requests: list[GenerationRequest]
    ) -> tuple[list[list[int]], list[str], list[list[TokenLogprob] | None]]:
        batch = len(requests)
        width = max(len(r.input_ids) for r in requests)
        ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for row, request in enumerate(requests):
            n = len(request.input_ids)
            ids[row, width - n :] = torch.tensor(request.input_ids, dtype=torch.long)
            mask[row, width - n :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        generators = [
            torch.Generator().manual_seed(r.seed) if r.seed is not None else None
            for r in requests
        ]
        outputs: list[list[int]] = [[] for _ in requests]
        logprobs: list[list[TokenLogprob] | None] = [
            None if r.logprobs is None else [] for r in requests
        ]
        reasons = ["length"] * batch
        done = [r.max_new_tokens <= 0 for r in requests]
        if all(done):
            return outputs, reasons, logprobs
        cache = DynamicCache(config=self.model.config)
        logits = self._forward(ids, mask, positions, cache)
        while not all(done):
            step = []
            for row, request in enumerate(requests):
                if done[row]:
                    step.append(self.pad_id)
                    continue
                token = _choose(logits[row], request, generators[row])
                step.append(token)
                outputs[row].append(token)
                scored = logprobs[row]
                if scored is not None and request.logprobs is not None:
                    scored.append(at_position(logits[row], token, request.logprobs))
                if token in self.eos_ids and not request.ignore_eos:
                    done[row], reasons[row] = True, "stop"
                elif request.stop and stop_index(self.decode(outputs[row]), request.stop) is not None:
                    done[row], reasons[row] = True, "stop"
                elif len(outputs[row]) >= request.max_new_tokens:
                    done[row] = True
            if all(done):
                break
            mask = torch.cat([mask, torch.ones((batch, 1), dtype=torch.long)], dim=1)
            positions = positions[:, -1:] + 1
            tokens = torch.tensor(step, dtype=torch.long)[:, None]
            logits = self._forward(tokens, mask, positions, cache)
        return outputs, reasons, logprobs

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        kwargs = {self._cache_arg: cache}
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **kwargs,
        )
        return out.logits[:, -1, :].float()


def _load_model(path: str) -> Any:
    """The checkpoint at ``path`` as transformers loads it (its weight conversions applied),
    in float32, for inference. Blocking."""
    model = load_causal_lm(path, dtype=torch.float32, local_files_only=True)
    model.eval()
    return model


def stop_index(text: str, stop: tuple[str, ...]) -> int | None:
    """Where the earliest of the ``stop`` sequences starts in ``text`` (None: none occurs)."""
    found = [index for index in (text.find(s) for s in stop) if index >= 0]
    return min(found) if found else None


def _choose(
    logits: torch.Tensor, request: GenerationRequest, generator: torch.Generator | None
) -> int:
    if request.temperature <= 0:
        return int(torch.argmax(logits).item())
    if request.top_k is not None and request.top_k < logits.shape[-1]:
        kept = torch.topk(logits, request.top_k).indices
        logits = torch.full_like(logits, -math.inf).scatter(0, kept, logits[kept])
    probs = torch.softmax(logits / request.temperature, dim=-1)
    if request.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < request.top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=generator).item())


def _generation_max_tokens(model: Any) -> int | None:
    """The ``max_new_tokens`` of the model's ``generation_config.json``, if it names one (a
    default for requests that ask for no length, as vLLM takes it)."""
    value = getattr(getattr(model, "generation_config", None), "max_new_tokens", None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _eos_ids(model: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return ids

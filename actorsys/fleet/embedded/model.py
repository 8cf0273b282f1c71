"""The model an embedded engine serves: loading, swapping weights, batched generation.

Everything here is blocking and not thread-safe; the server calls it from one worker thread
at a time (a lock serialises generation batches and weight loads), so a batch never sees two
checkpoints and each answer carries the version of the weights that produced it.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from actorsys.fleet.checkpoint import (
    CheckpointMismatchError,
    check_checkpoint,
    read_config,
    read_tensor_infos,
    weight_files,
)

INITIAL_VERSION = "default"


@dataclass(frozen=True)
class GenerationRequest:
    """One sequence to continue. ``temperature == 0`` is greedy; ``seed`` makes sampling
    repeatable."""

    input_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False


@dataclass(frozen=True)
class GenerationResult:
    output_ids: list[int]
    finish_reason: str
    weight_version: str


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
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        self.model.eval()
        self.config = read_config(self.model_dir)
        self.tensors = read_tensor_infos(self.model_dir)
        self.keep_old_weights = keep_old_weights
        self.label_kept_weights = label_kept_weights
        self.version = INITIAL_VERSION
        self.model_path = self.model_dir
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 2048))
        self.vocab_size = int(self.model.config.vocab_size)
        self.eos_ids = _eos_ids(self.model)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (min(self.eos_ids) if self.eos_ids else 0))
        parameters = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"

    def load(self, path: str, version: str | None, *, require_complete: bool) -> None:
        """Replace the weights with those of checkpoint ``path`` and label them ``version``
        (None keeps the label).

        Raises :class:`CheckpointMismatchError` if ``path`` is missing, incomplete where
        required, corrupt, or of another architecture; the served weights are then unchanged,
        because every tensor is read and checked before any is copied in.
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
        with torch.no_grad():
            self.model.load_state_dict(state, strict=False)
        self.model_path = path
        if version is not None:
            self.version = version

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    @torch.inference_mode()
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Continue every request in one left-padded batch with a shared KV cache."""
        if not requests:
            return []
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
        reasons = ["length"] * batch
        done = [r.max_new_tokens <= 0 for r in requests]
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
                if token in self.eos_ids and not request.ignore_eos:
                    done[row], reasons[row] = True, "stop"
                elif len(outputs[row]) >= request.max_new_tokens:
                    done[row] = True
            if all(done):
                break
            mask = torch.cat([mask, torch.ones((batch, 1), dtype=torch.long)], dim=1)
            positions = positions[:, -1:] + 1
            tokens = torch.tensor(step, dtype=torch.long)[:, None]
            logits = self._forward(tokens, mask, positions, cache)
        return [
            GenerationResult(output_ids=out, finish_reason=reason, weight_version=self.version)
            for out, reason in zip(outputs, reasons, strict=True)
        ]

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


def _choose(
    logits: torch.Tensor, request: GenerationRequest, generator: torch.Generator | None
) -> int:
    if request.temperature <= 0:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits / request.temperature, dim=-1)
    if request.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < request.top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=generator).item())


def _eos_ids(model: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return ids

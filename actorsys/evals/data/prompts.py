"""The prompts of an evaluation as one snapshot is sent them: plain text as it is, chat
prompts rendered by that snapshot's own chat template (as token ids), each fitted to its
context (:mod:`actorsys.evals.data.context_fit`).

A chat dataset (``apply_chat_template``) is rendered at every evaluation by the tokenizer
saved with the snapshot being evaluated, since a template can change between checkpoints
(:func:`actorsys.fleet.chat_template.render_chat`): the record's messages (a string is one user
message), its tools, the dataset's ``chat_template_kwargs`` and the generation prompt. The
engine is sent the rendered **token ids**, which the CPU engine, vLLM and sglang take as they
are: the template's BOS once, and no second one from a tokenizer that adds a BOS to plain text
(Llama-3's does, and two BOS are a prompt the model never saw). Samples keep the rendered text.

A snapshot whose tokenizer has no chat template (or that has no tokenizer) cannot be scored
on a chat dataset: the point skips ``no_chat_template``, naming the snapshot. A record whose
conversation the template refuses (a Jinja ``raise_exception``, or any other failure of the
template: it is rendered in a render worker process, within a deadline and a memory cap) is not
sent: it scores 0, counted in ``eval/<name>/errors``. A template that runs past its deadline
once (its worker is killed) is not asked again for that dataset at that snapshot: the records
after it are refused with the same reason, so a template that loops costs one deadline, not
one per record.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from actorsys.contracts import EvalSkip
from actorsys.evals.data.context_fit import Fit, fit, positions_of, tell
from actorsys.evals.data.dataset import EvalDataset
from actorsys.fleet.chat_template import (
    ChatTemplateMissingError,
    has_chat_template,
    load_tokenizer,
    overran,
    render_chat,
    warm_renderer,
)

MAX_SHOWN_REFUSED = 2000
"""Characters of a refused conversation a sample keeps."""

Prompt = str | list[int]
"""What a completion request carries: text, or token ids."""


@dataclass(frozen=True)
class DatasetPrompts:
    """One dataset's prompts for one snapshot, per record: what is ``sent`` (text or token
    ids; None: not sent, ``refusals`` says why), what samples keep (``shown``), and how each
    fits the context (``fits``; None where it cannot be counted)."""

    sent: list[Prompt | None]
    shown: list[str]
    fits: list[Fit] | None
    refusals: list[str | None]


def prepare_prompts(
    checkpoint_dir: str | None, datasets: Sequence[EvalDataset]
) -> list[DatasetPrompts]:
    """The prompts of ``datasets`` for the snapshot at ``checkpoint_dir`` (None: plain
    prompts as they are, not fitted). Raises :class:`EvalSkip` ``no_chat_template`` where a
    chat dataset cannot be rendered for it. Blocking: loads the tokenizer, renders and
    tokenizes every prompt; run it in a worker thread."""
    chat = any(d.apply_chat_template for d in datasets)
    if chat:
        warm_renderer()  # its start overlaps the tokenizer's load
    if checkpoint_dir is None:
        if chat:
            raise EvalSkip(ChatTemplateMissingError.reason,
                           "no snapshot directory to read the chat template from")
        return [_plain(d, None, None) for d in datasets]
    positions = positions_of(checkpoint_dir)
    tokenizer = None
    if chat or positions is not None:
        try:
            tokenizer = load_tokenizer(checkpoint_dir)
        except (OSError, ValueError, KeyError) as exc:
            if chat:
                raise EvalSkip(ChatTemplateMissingError.reason,
                               f"no tokenizer loads from {checkpoint_dir} to render the chat "
                               f"prompts: {type(exc).__name__}: {exc}") from None
            tell("no usable tokenizer", f"{checkpoint_dir}: {type(exc).__name__}")
    if chat and not has_chat_template(tokenizer):
        raise EvalSkip(ChatTemplateMissingError.reason, str(ChatTemplateMissingError(checkpoint_dir)))
    return [
        _chat(d, tokenizer, positions, checkpoint_dir) if d.apply_chat_template
        else _plain(d, tokenizer, positions)
        for d in datasets
    ]


def _plain(dataset: EvalDataset, tokenizer: Any, positions: int | None) -> DatasetPrompts:
    prompts: list[str] = dataset.prompts
    fits = None
    if tokenizer is not None and positions is not None:
        lengths = [len(ids) for ids in tokenizer(prompts)["input_ids"]]
        fits = [fit(length, dataset.max_tokens, positions) for length in lengths]
    return DatasetPrompts(list(prompts), list(prompts), fits, [None] * len(prompts))


def _chat(
    dataset: EvalDataset, tokenizer: Any, positions: int | None, checkpoint_dir: str
) -> DatasetPrompts:
    sent: list[Prompt | None] = []
    shown: list[str] = []
    refusals: list[str | None] = []
    fits: list[Fit] = []
    overrun: str | None = None
    for index in range(len(dataset.records)):
        try:
            if overrun is not None:
                raise ValueError(overrun)
            rendered = render_chat(
                tokenizer,
                dataset.messages(index),
                tools=dataset.tools(index),
                chat_template_kwargs=dataset.chat_template_kwargs,
                add_generation_prompt=True,
                path=checkpoint_dir,
            )
        except ValueError as exc:
            if overran(exc):
                overrun = f"not rendered: the chat template overran on record {index}: {exc}"
            sent.append(None)
            shown.append(json.dumps(dataset.messages(index))[:MAX_SHOWN_REFUSED])
            refusals.append(str(exc))
            if positions is not None:
                fits.append(fit(0, dataset.max_tokens, positions))
            continue
        sent.append(list(rendered.token_ids))
        shown.append(rendered.text)
        refusals.append(None)
        if positions is not None:
            fits.append(fit(len(rendered.token_ids), dataset.max_tokens, positions))
    return DatasetPrompts(sent, shown, fits if positions is not None else None, refusals)

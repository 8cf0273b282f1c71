"""Fitting requests into the model's context: ``max_tokens`` cut to what a prompt leaves.

Every engine refuses (HTTP 400) a request whose prompt plus ``max_tokens`` exceeds the model's
positions, and a refused request scores 0: with miles' default ``--eval-max-response-len 256``
and a model of 256 positions every request would be refused. So before sampling, each prompt
(a chat prompt as its template renders it, in token ids) is counted with the snapshot's own
tokenizer against its config's ``max_position_embeddings``:

- a request asking for more than its prompt leaves is cut to what fits (the sample counts in
  ``eval/<name>/truncated_ratio``);
- a prompt that alone fills the context is not sent: it scores 0, counted in
  ``eval/<name>/errors``, as a request the server would refuse (``bad_request``).

A snapshot without a config or a tokenizer (a test's fake checkpoint) leaves the requests as
the datasets ask; that is logged once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from actorsys.evals.data.dataset import EvalDataset
from actorsys.fleet.chat_template import load_tokenizer

log = logging.getLogger("actorsys.evals")

_told: set[str] = set()


@dataclass(frozen=True)
class Fit:
    """How one prompt fits a context of ``positions`` tokens: its length in tokens, the
    ``max_tokens`` to ask (None: the prompt alone fills the context), and whether that is less
    than its dataset asks."""

    prompt_tokens: int
    max_tokens: int | None
    cut: bool
    positions: int

    @property
    def refusal(self) -> str:
        """Why a prompt that does not fit is not sent."""
        return (f"prompt of {self.prompt_tokens} tokens leaves no room to answer in the "
                f"model's {self.positions} positions (not sent)")


def fit_datasets(checkpoint_dir: str, datasets: Sequence[EvalDataset]) -> list[list[Fit]] | None:
    """How the prompts of ``datasets`` fit the context of the model at ``checkpoint_dir``
    (``[d][p]``: dataset ``d``, prompt ``p``); None where its config names no length or no
    tokenizer loads. Blocking: loads the tokenizer and
    tokenizes every prompt; run it in a worker thread."""
    positions = positions_of(checkpoint_dir)
    if positions is None:
        return None
    try:
        tokenizer = load_tokenizer(checkpoint_dir)
    except (OSError, ValueError, KeyError) as exc:
        tell("no usable tokenizer", f"{checkpoint_dir}: {type(exc).__name__}")
        return None
    fits = []
    for dataset in datasets:
        lengths = [len(ids) for ids in tokenizer(dataset.prompts)["input_ids"]]
        fits.append([fit(length, dataset.max_tokens, positions) for length in lengths])
    return fits


def fit(prompt_tokens: int, max_tokens: int, positions: int) -> Fit:
    """How a prompt of ``prompt_tokens`` tokens asking ``max_tokens`` fits ``positions``."""
    room = positions - prompt_tokens
    if room <= 0:
        return Fit(prompt_tokens, None, True, positions)
    return Fit(prompt_tokens, min(max_tokens, room), room < max_tokens, positions)


def positions_of(checkpoint_dir: str) -> int | None:
    """The context length the config at ``checkpoint_dir`` names, or None (logged once)."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(checkpoint_dir, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        tell("no usable config", f"{checkpoint_dir}: {type(exc).__name__}")
        return None
    positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    if isinstance(positions, bool) or not isinstance(positions, int) or positions < 1:
        tell("no max_position_embeddings in the config", checkpoint_dir)
        return None
    return positions


def tell(why: str, where: str) -> None:
    if why not in _told:
        _told.add(why)
        log.info("requests are not fitted to the context: %s (%s)", why, where)

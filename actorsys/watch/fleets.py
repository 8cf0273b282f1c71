"""The fleets ``watch`` evaluates on: CPU engines it starts (``--engines N``), or servers
that run anyway (``--engine-url URL ...``), split into ``--fleets K`` fleets that evaluate in
parallel."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial

import trio

from actorsys.fleet.clients.flavor import Flavor, engine_of_flavor
from actorsys.fleet.clients.sglang import SGLangEngine
from actorsys.fleet.clients.vllm import VLLMEngine
from actorsys.fleet.fleet import EngineUnhealthyError, Fleet
from actorsys.fleet.local.fleet import LocalFleet
from actorsys.fleet.local.specs import VLLM_PYTHON, EngineSpec, embedded, vllm
from actorsys.fleet.on_all import EngineUnauthorizedError
from actorsys.runtime import ThreadTracker, run_blocking
from actorsys.watch.scan import Checkpoint

READS = ThreadTracker()
"""Reads of a checkpoint's config still running in a worker thread (abandoned when the
watcher was cancelled)."""


def split(engines: Sequence[object], fleets: int) -> list[list[object]]:
    """``engines`` dealt round-robin into ``fleets`` groups."""
    return [list(engines[index::fleets]) for index in range(fleets)]


def engine_specs(
    model_dir: str, *, engines: int, flavor: str, vllm_args: Sequence[str] = ()
) -> list[EngineSpec]:
    """``engines`` CPU engines serving ``model_dir``: vLLM's for ``flavor="vllm"`` (given
    ``vllm_args`` too), the embedded engine's otherwise."""
    if flavor == "vllm":
        length = model_length(model_dir)
        return [vllm(model_dir, python=VLLM_PYTHON, max_model_len=length, extra_args=vllm_args)
                for _ in range(engines)]
    return [embedded(model_dir) for _ in range(engines)]


@asynccontextmanager
async def started_fleets(
    checkpoint: Checkpoint,
    *,
    engines: int,
    fleets: int,
    flavor: Flavor,
    log_dir: str | None,
    startup_timeout: float = 300.0,
) -> AsyncIterator[list[Fleet]]:
    """Start ``engines`` CPU engines serving ``checkpoint`` (vLLM for ``flavor="vllm"``, the
    embedded engine otherwise), dealt into ``fleets`` fleets; stop them on the way out."""
    specs = await run_blocking(
        partial(engine_specs, checkpoint.path, engines=engines, flavor=flavor),
        abandon_on_cancel=True,  # it only reads the checkpoint's config
        limiter=trio.CapacityLimiter(1),
        description=f"read the config of {checkpoint.path}",
        tracker=READS,
    )
    async with LocalFleet.open(specs, log_dir=log_dir, startup_timeout=startup_timeout) as local:
        yield [Fleet(group) for group in split(local.fleet.engines, fleets)]  # type: ignore[arg-type]


@asynccontextmanager
async def attached_fleets(
    urls: Sequence[str], *, fleets: int, flavor: Flavor, api_key: str | None = None
) -> AsyncIterator[list[Fleet]]:
    """Clients of the servers at ``urls`` (never started or stopped here), dealt into
    ``fleets`` fleets. ``flavor="auto"`` asks each server which API it speaks. ``api_key``:
    the servers' key, sent as a bearer token."""
    clients = [
        await engine_for_url(url, flavor, name=f"engine-{i}", api_key=api_key)
        for i, url in enumerate(urls)
    ]
    yield [Fleet(group) for group in split(clients, fleets)]  # type: ignore[arg-type]


async def engine_for_url(
    url: str, flavor: Flavor, *, name: str, api_key: str | None = None
) -> SGLangEngine | VLLMEngine:
    """The client of the server at ``url``: sglang's API (also the embedded engine's) or
    vLLM's weight-update endpoints. Raises :class:`EngineUnhealthyError` if ``auto`` finds
    neither."""
    def make(kind: str) -> SGLangEngine | VLLMEngine:
        if kind == "sglang":
            return SGLangEngine(url, name=name, api_key=api_key)
        return VLLMEngine(url, name=name, api_key=api_key)

    try:
        return await engine_of_flavor(flavor, make)
    except EngineUnauthorizedError:
        raise
    except EngineUnhealthyError as exc:
        raise EngineUnhealthyError(
            name, f"{url} speaks neither sglang's API nor vLLM's weight-update endpoints ({exc}); "
            "pass --flavor"
        ) from exc


def model_length(model_dir: str, cap: int = 512) -> int:
    """The context length to serve ``model_dir`` with: its ``max_position_embeddings``, at
    most ``cap`` (vLLM refuses a ``--max-model-len`` beyond what the model was built for)."""
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        positions = json.load(f).get("max_position_embeddings") or cap
    return min(cap, int(positions))


def vllm_missing() -> str | None:
    return None if os.path.exists(VLLM_PYTHON) else VLLM_PYTHON

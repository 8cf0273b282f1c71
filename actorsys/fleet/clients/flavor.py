"""Which API a server speaks: sglang's (also the embedded engine's) or vLLM's.

One probe serves every place that attaches to a server by URL (``ServerEvalFn``, ``watch
--engine-url``), so they agree on what ``flavor="auto"`` means.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeVar

from actorsys.fleet.fleet import Engine, EngineUnhealthyError
from actorsys.fleet.on_all import EngineUnauthorizedError

Flavor = Literal["auto", "vllm", "sglang"]
FLAVORS: tuple[Flavor, ...] = ("auto", "vllm", "sglang")

E = TypeVar("E", bound=Engine)


async def engine_of_flavor(flavor: Flavor, make: Callable[[Literal["vllm", "sglang"]], E]) -> E:
    """The client ``make`` builds for ``flavor``; for ``"auto"``, the first of sglang's and
    vLLM's clients that can read the server's weight version.

    Blocks on at most two requests, bounded by the clients' own timeouts and the caller's
    cancel scope. Raises :class:`~actorsys.fleet.EngineUnhealthyError` (from the vLLM client)
    when the server answers neither, and the sglang client's
    :class:`~actorsys.fleet.on_all.EngineUnauthorizedError` at once when the server refuses
    our key.
    """
    if flavor != "auto":
        return make(flavor)
    sglang = make("sglang")
    try:
        await sglang.weight_version()
        return sglang
    except EngineUnauthorizedError:
        raise
    except EngineUnhealthyError:
        vllm = make("vllm")
        await vllm.weight_version()
        return vllm

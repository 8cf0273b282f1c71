"""The Engine protocol: what every inference engine of a :class:`~actorsys.fleet.fleet.Fleet`
provides (health, a weight load labelled with a version, the version read back)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Engine"]


@runtime_checkable
class Engine(Protocol):
    """One inference engine (a vLLM or sglang server, a Ray actor, the embedded engine).

    Every method may raise; the fleet turns that into a skip reason. None of them take a
    timeout: the caller's cancel scope bounds them, and cancelling must not leave the engine
    half-updated in a way a later ``load_weights`` cannot repair.
    """

    name: str

    async def health(self) -> None:
        """Return if the engine can serve; raise if not."""

    async def load_weights(self, path: str, version: str) -> None:
        """Load the checkpoint at ``path`` and label the loaded weights ``version``.

        May raise a :class:`~actorsys.fleet.on_all.PinError` with its own reason (e.g.
        :class:`~actorsys.fleet.on_all.CheckpointRejectedError`); any other exception makes
        the pin ``unhealthy``.
        """

    async def weight_version(self) -> str | None:
        """The version label of the weights the engine serves now."""

"""The engines' side of the weight probe: what an engine must offer to be probed, and the
probe state of one fleet (:class:`WeightProbe`: the prompts, the reference, the engines'
answers, asked concurrently)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import trio

from actorsys._errors import ProbeUnsupportedError
from actorsys.fleet.on_all import EngineUnhealthyError, Named, on_all
from actorsys.fleet.pin.probe.compare import Answer, PrefillAnswer
from actorsys.fleet.pin.probe.prompts import (
    PROBE_TOKENS,
    ReferenceUnavailableError,
    prefill_sequences,
    read_probe_prompts,
)
from actorsys.fleet.pin.probe.reference_answer import (
    Reference,
    ReferenceFailedError,
    ReferenceSource,
)
from actorsys.runtime import ThreadTracker, run_blocking

log = logging.getLogger("actorsys.fleet")


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


class PendingPrompts:
    """Probe prompts being read (:meth:`WeightProbe.prompts_beside`)."""

    def __init__(self) -> None:
        self.read = trio.Event()
        self._prompts: list[list[int]] | None = None

    async def read_from(self, weight_probe: WeightProbe, path: str) -> None:
        try:
            self._prompts = await weight_probe.prompts(path)
        finally:
            self.read.set()

    def ready(self, prompts: list[list[int]]) -> None:
        self._prompts = prompts
        self.read.set()

    async def wait(self) -> list[list[int]] | None:
        """The prompts once read; None where the snapshot has none (or none was asked)."""
        await self.read.wait()
        return self._prompts


class WeightProbe:
    """The probe state of one fleet: the reasons already logged for checking only the
    version.

    A pin uses it in three steps: :meth:`prompts_beside` (a task beside the loads),
    :meth:`ask` and :meth:`reference` (each a task of its own, once the engines read the
    version back), then :func:`judge` the answers against the reference.
    """

    def __init__(self) -> None:
        self.tracker = ThreadTracker()
        self._files = trio.CapacityLimiter(1)
        self._logged: set[str] = set()
        self._last_prompts: tuple[str, list[list[int]]] | None = None

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
            prompts = await run_blocking(
                lambda: read_probe_prompts(path),
                abandon_on_cancel=True,
                limiter=self._files,
                description=f"weight probe prompts of {path}",
                tracker=self.tracker,
            )
        except ReferenceUnavailableError as exc:
            self.note_once(str(exc))
            return None
        self._last_prompts = (path, prompts)
        return prompts

    def prompts_beside(self, nursery: trio.Nursery, path: str | None) -> PendingPrompts:
        """:meth:`prompts` of ``path`` read in a task of ``nursery`` while the caller goes on;
        ready at once for no ``path``, or for the path read last (a shared fleet's
        ``base_checkpoint``, the same at every pin: its config is read once)."""
        pending = PendingPrompts()
        if path is None:
            pending.read.set()
        elif self._last_prompts is not None and self._last_prompts[0] == path:
            pending.ready(self._last_prompts[1])
        else:
            nursery.start_soon(pending.read_from, self, path)
        return pending

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
        sequences = prefill_sequences(prompts)

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

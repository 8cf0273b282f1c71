"""ServerEvalFn: evaluate datasets on a vLLM or sglang server outside the pipeline's fleets.

Attach to a server that runs anyway (it is never started or stopped here)::

    eval_fn = ServerEvalFn(datasets, url="http://10.0.0.7:8000")

or launch one, on a free port of 127.0.0.1 (``{port}`` in the argv is replaced), stopped by
``dispose()``::

    eval_fn = ServerEvalFn(datasets, launch=[sys.executable, "-m", "actorsys", "engine",
                                             "--model", base_dir, "--port", "{port}"])
    async with EvalSupervisor.open(config, eval_fn=eval_fn) as sup:   # no fleet=
        ...

The server is a :class:`~actorsys.Fleet` of one engine
(:class:`~actorsys.fleet.external.ExternalServer`), pinned like every fleet. Construction
never waits. The first evaluation waits (up to ``ready_timeout``) until the server answers
``/health`` and finds its flavor. Each evaluation then pins it through
:meth:`Fleet.pin_and_verify <actorsys.Fleet.pin_and_verify>` (health, load, the version read
back, the weight probe), polling until the server serves the step's version (connection errors
and 5xx while it reloads or restarts are retried until ``pin_timeout``, then the point skips
``pin_violation``); samples and scores the datasets exactly as :class:`DatasetEval` does (a
dataset with an ``interval`` only at its steps; at a step where none is due the server is not
touched),
while the probe's verdict is judged; and reads the version back: a version that changed
meanwhile (someone else reloaded a shared server) is ``pin_violation``, and so is a server
that answers with weights other than the snapshot's under the right version (the verdict).
vLLM is asked to load only checkpoints that passed our checks (a failed vLLM reload kills the
server). A launched server that died skips the point ``unhealthy``. One evaluation runs on the
server at a time.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, TypeVar

import trio

from actorsys._http import Backoff
from actorsys.config import require_seconds
from actorsys.contracts import (
    CheckpointEvalFn,
    EvalSkip,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
    model_files,
)
from actorsys.evals.data.dataset import EvalDataset
from actorsys.evals.harnesses.sampling import (
    ScorerWarmUp,
    check_datasets,
    check_limits,
    due_datasets,
    evaluate_datasets,
    not_due_output,
)
from actorsys.fleet import (
    CheckpointRejectedError,
    Engine,
    EngineUnhealthyError,
    Fleet,
    PinError,
    PinViolationError,
    SGLangEngine,
    VLLMEngine,
)
from actorsys.fleet.clients.flavor import Flavor
from actorsys.fleet.clients.vllm import RELOAD, TIED_RELOAD
from actorsys.fleet.external import ExternalServer, ManagedProcess
from actorsys.fleet.on_all import EngineUnauthorizedError
from actorsys.fleet.pin.verdict import PinVerdict

log = logging.getLogger("actorsys.evals")

POLL_INITIAL_DELAY = 0.25
POLL_MAX_DELAY = 5.0
STOP_GRACE = 5.0
T = TypeVar("T")
ServerClient = VLLMEngine | SGLangEngine


class ServerEvalFn(ScorerWarmUp, CheckpointEvalFn):
    """Samples and scores ``datasets`` on one external server, pinned to each checkpoint.

    Exactly one of ``url`` (attach) or ``launch`` (an argv with ``{port}``; the process gets
    ``VLLM_SERVER_DEV_MODE=1`` so vLLM exposes its weight-update endpoints; a launched vLLM
    server also gets actorsys' worker extension, so that models with tied embeddings reload
    correctly, unless the argv names a ``--worker-extension-cls`` of its own) is given.
    ``flavor``: ``"vllm"``, ``"sglang"`` (also the embedded engine) or ``"auto"`` (probed at
    the first evaluation). ``api_key`` is sent as a bearer token; a launched server listens
    on 127.0.0.1 (its argv's ``--host`` is replaced) and requires a key, ``api_key`` or a
    random one, handed over in ``ACTORSYS_API_KEY`` and ``VLLM_API_KEY``. ``concurrency``,
    ``request_timeout`` and ``retries`` bound the sampling requests as for
    :class:`DatasetEval`. ``probe`` runs the weight probe at every pin (as
    ``EvalConfig(probe=...)`` does for the pipeline's fleets). Bad arguments raise
    :class:`~actorsys.ConfigError` at construction; nothing is started before the first
    evaluation.

    ``evaluate_checkpoint`` blocks on the server; the supervisor's ``eval_timeout`` and close
    cancel it. ``dispose()`` (awaited by the supervisor at close) stops a launched server:
    SIGTERM to its process group, SIGKILL after ``grace`` seconds; it is shielded and returns
    within about twice ``grace`` also when cancelled.
    """

    runtime = "trio"

    def __init__(
        self,
        datasets: EvalDataset | Sequence[EvalDataset],
        *,
        url: str | None = None,
        launch: Sequence[str] | None = None,
        flavor: Flavor = "auto",
        api_key: str | None = None,
        ready_timeout: float = 1800.0,
        concurrency: int = 32,
        request_timeout: float = 120.0,
        pin_timeout: float = 600.0,
        retries: int = 2,
        grace: float = STOP_GRACE,
        probe: bool = True,
    ) -> None:
        super().__init__()
        self.datasets = check_datasets("ServerEvalFn", datasets)
        self.server = ExternalServer(
            url=url,
            launch=launch,
            flavor=flavor,
            make_engine=lambda flavor, url: self.make_engine(flavor, url),
            ready_timeout=require_seconds("ServerEvalFn(ready_timeout)", ready_timeout),
            grace=require_seconds("ServerEvalFn(grace)", grace),
            api_key=api_key,
            owner="ServerEvalFn",
        )
        check_limits("ServerEvalFn", concurrency, retries)
        self.flavor: Flavor = flavor
        self.ready_timeout = ready_timeout
        self.request_timeout = require_seconds("ServerEvalFn(request_timeout)", request_timeout)
        self.pin_timeout = require_seconds("ServerEvalFn(pin_timeout)", pin_timeout)
        self.grace = grace
        self.concurrency = concurrency
        self.retries = retries
        self.probe = bool(probe)
        self._lock = trio.Lock()

    def __repr__(self) -> str:
        target = self.server.url if self.server.launch is None else f"launch={self.server.launch!r}"
        return f"ServerEvalFn({[d.name for d in self.datasets]}, {target})"

    @property
    def url(self) -> str | None:
        """The server's base URL (for a launched one: once launched)."""
        return self.server.url

    @property
    def api_key(self) -> str | None:
        """The key sent to the server (for a launched one, once launched: the key it
        requires)."""
        return self.server.api_key

    @property
    def launch(self) -> list[str] | None:
        return self.server.launch

    @property
    def tied_reload(self) -> bool:
        """Whether the launched server gets actorsys' worker extension (and is reloaded
        through it)."""
        return self.server.tied_reload

    @property
    def process(self) -> ManagedProcess | None:
        """The launched server's process while it runs (None when attached or disposed)."""
        return self.server.process

    @property
    def log_path(self) -> str | None:
        return self.server.log_path

    def make_engine(self, flavor: Literal["vllm", "sglang"], url: str) -> ServerClient:
        """The client of the server for ``flavor``: :class:`VLLMEngine` or
        :class:`SGLangEngine`."""
        if flavor == "vllm":
            return VLLMEngine(url, name=url, api_key=self.api_key,
                              request_timeout=self.request_timeout, load_timeout=self.pin_timeout,
                              reload_method=TIED_RELOAD if self.tied_reload else RELOAD)
        return SGLangEngine(url, name=url, api_key=self.api_key,
                            request_timeout=self.request_timeout, load_timeout=self.pin_timeout)

    async def evaluate_checkpoint(
        self, checkpoint_dir: str | None, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        """Pin the server to the point's checkpoint, or, for a served point (no
        checkpoint: the server is one of the trainer's shared engines), to the version it
        serves, loading nothing; then evaluate; see the module docstring."""
        version = input.weight_version or str(input.rollout_id)
        due, not_due = due_datasets(self.datasets, input.rollout_id)
        if not due:
            # nothing to score at this step: the server is neither started nor pinned
            return not_due_output(not_due)
        async with self._lock:
            fleet = await self._on_server(self.server.fleet)
            return await self._on_server(
                lambda: self._evaluate(
                    fleet, checkpoint_dir, version, input.rollout_id,
                    model_files(checkpoint_dir, input),
                )
            )

    async def dispose(self) -> None:  # type: ignore[override]
        """Stop the launched server, if any (SIGTERM, then SIGKILL after ``grace``); remove
        its log. Shielded: returns within about twice ``grace`` even when cancelled."""
        await self.server.stop()

    async def _evaluate(
        self, fleet: Fleet, path: str | None, version: str, step: int, files: str | None
    ) -> RolloutFnEvalOutput:
        """Pin (to ``path``; None: to the version served), sample and score (chat prompts
        rendered with ``files``' template) while the probe is judged, read the version back;
        the verdict, once known, overrules what the evaluation found."""
        verdict: PinVerdict | None = None
        failure: Exception | None = None
        async with trio.open_nursery() as nursery:
            try:
                verdict = await self._pin(nursery, fleet, path, version)
                output = await evaluate_datasets(
                    fleet,
                    self.datasets,
                    concurrency=self.concurrency,
                    request_timeout=self.request_timeout,
                    retries=self.retries,
                    checkpoint_dir=files,
                    step=step,
                )
                served = await self._version_now(fleet.engines[0])
            except Exception as exc:
                failure = exc
        if verdict is not None:
            try:
                await verdict.wait()
            except PinError as exc:
                raise EvalSkip(exc.reason, f"{exc} (the evaluation's result is discarded)") from exc
        if failure is not None:
            raise failure
        if served != version:
            raise EvalSkip(
                "pin_violation",
                f"{self.url} served version {served!r} after the evaluation of {version!r}"
                " (reloaded by someone else meanwhile?)",
            )
        if verdict is not None and verdict.unverified is not None:
            return RolloutFnEvalOutput(verdict.annotate(output.data), output.metrics)
        return output

    async def _pin(
        self, nursery: trio.Nursery, fleet: Fleet, path: str | None, version: str
    ) -> PinVerdict:
        """Pin ``fleet`` until it serves ``version`` (loading ``path``; None: loading
        nothing, the trainer updates the server), within ``pin_timeout``; its verdict is
        judged in ``nursery`` by the same deadline."""
        deadline = trio.current_time() + self.pin_timeout
        problem = "no answer"
        backoff = Backoff(POLL_INITIAL_DELAY, POLL_MAX_DELAY)
        with trio.move_on_at(deadline):
            async for _ in backoff:
                try:
                    pin = (
                        functools.partial(fleet.pin_served, version, probe=self.probe,
                                          deadline=deadline)
                        if path is None else
                        functools.partial(fleet.pin_and_verify, path, version,
                                          probe=self.probe, deadline=deadline)
                    )
                    verdict: PinVerdict = await nursery.start(pin)
                    return verdict
                except CheckpointRejectedError as exc:
                    raise EvalSkip(exc.reason, str(exc)) from exc
                except PinViolationError as exc:
                    problem = f"it serves version {exc.actual!r}"
                except EngineUnauthorizedError as exc:
                    raise EvalSkip(exc.reason, str(exc)) from exc
                except EngineUnhealthyError as exc:
                    problem = str(exc)
                log.info("%s: not pinned to %s yet (%s); retrying in %.1f s", self.url,
                         version, problem, backoff.delay)
        raise EvalSkip("pin_violation", f"{self.url} did not serve version {version!r} within "
                                        f"{self.pin_timeout} s: {problem}")

    async def _version_now(self, engine: Engine) -> str | None:
        with trio.move_on_after(self.request_timeout):
            try:
                return await engine.weight_version()
            except EngineUnhealthyError as exc:
                raise EvalSkip("unhealthy", f"{self.url} could not report its version after "
                                            f"the evaluation: {exc}") from exc
        raise EvalSkip("unhealthy", f"{self.url} did not report its version within "
                                    f"{self.request_timeout} s after the evaluation")

    async def _on_server(self, call: Callable[[], Awaitable[T]]) -> T:
        """``await call()`` while the server lives; a server that is not ready, died, or
        speaks no known flavor skips the point ``unhealthy``."""
        try:
            return await self.server.while_alive(call)
        except PinError as exc:
            raise EvalSkip(exc.reason, str(exc)) from exc

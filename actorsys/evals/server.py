"""ServerEvalFn: evaluate datasets on a vLLM or sglang server outside the pipeline's fleets.

Attach to a server that runs anyway (it is never started or stopped here)::

    eval_fn = ServerEvalFn(datasets, url="http://10.0.0.7:8000")

or launch one, on a free port of 127.0.0.1 (``{port}`` in the argv is replaced), stopped by
``dispose()``::

    eval_fn = ServerEvalFn(datasets, launch=[sys.executable, "-m", "actorsys", "engine",
                                             "--model", base_dir, "--port", "{port}"])
    async with EvalSupervisor.open(config, eval_fn=eval_fn) as sup:   # no fleet=
        ...

Construction never waits. The first evaluation waits (up to ``ready_timeout``) until the
server answers ``/health`` and finds its flavor. Each evaluation then loads the checkpoint and
polls the served version until it is the step's (connection errors and 5xx while the server
reloads or restarts are retried until ``pin_timeout``, then the point skips
``pin_violation``), samples and scores the datasets exactly as :class:`DatasetEval` does,
and reads the version back: a version that changed meanwhile (someone else reloaded a shared
server) is ``pin_violation``. vLLM is asked to load only checkpoints that passed our checks
(a failed vLLM reload kills the server). A launched server that died skips the point
``unhealthy``. One evaluation runs on the server at a time.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, TypeVar

import trio

from actorsys._errors import ConfigError
from actorsys.config import require_seconds
from actorsys.contracts import CheckpointEvalFn, EvalSkip, RolloutFnEvalInput, RolloutFnEvalOutput
from actorsys.evals.datasets import EvalDataset
from actorsys.evals.sampling import check_datasets, check_limits, evaluate_datasets
from actorsys.fleet._http import check_url
from actorsys.fleet._process import ManagedProcess, spawn
from actorsys.fleet.embedded import API_KEY_ENV as ENGINE_API_KEY_ENV
from actorsys.fleet.engine import CheckpointRejectedError, EngineUnhealthyError, Fleet
from actorsys.fleet.flavor import FLAVORS, Flavor, engine_of_flavor
from actorsys.fleet.local import free_port, new_api_key, on_host
from actorsys.fleet.sglang import SGLangEngine
from actorsys.fleet.vllm import RELOAD, TIED_RELOAD, VLLMEngine
from actorsys.fleet.vllm_worker import API_KEY_MIDDLEWARE, EXTENSION_CLASS, WORKER_DIR
from actorsys.fleet.vllm_worker.actorsys_api_key import KEY_ENV as VLLM_API_KEY_ENV

log = logging.getLogger("actorsys.evals")

POLL_INITIAL_DELAY = 0.25
POLL_MAX_DELAY = 5.0
STOP_GRACE = 5.0
T = TypeVar("T")
ServerClient = VLLMEngine | SGLangEngine


class ServerEvalFn(CheckpointEvalFn):
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
    :class:`DatasetEval`. Bad arguments raise :class:`~actorsys.ConfigError` at construction;
    nothing is started before the first evaluation.

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
    ) -> None:
        super().__init__()
        self.datasets = check_datasets("ServerEvalFn", datasets)
        if (url is None) == (launch is None):
            raise ConfigError("ServerEvalFn(url, launch)", "pass exactly one: url= to attach to "
                              "a running server, launch= to start one")
        if url is not None:
            url = check_url(url, "ServerEvalFn")
        if launch is not None:
            if isinstance(launch, str) or not launch or not all(isinstance(a, str) for a in launch):
                raise ConfigError("ServerEvalFn(launch)", f"expected an argv list of strings, got "
                                  f"{launch!r}")
            if not any("{port}" in arg for arg in launch):
                raise ConfigError("ServerEvalFn(launch)", "the argv must contain '{port}' where "
                                  "the server's port goes, e.g. '--port', '{port}'")
        if flavor not in FLAVORS:
            raise ConfigError("ServerEvalFn(flavor)", f"expected one of {', '.join(FLAVORS)}, "
                              f"got {flavor!r}")
        check_limits("ServerEvalFn", concurrency, retries)
        self.url = url
        self.launch = list(launch) if launch is not None else None
        self.flavor: Flavor = flavor
        self.api_key = api_key
        self.ready_timeout = require_seconds("ServerEvalFn(ready_timeout)", ready_timeout)
        self.request_timeout = require_seconds("ServerEvalFn(request_timeout)", request_timeout)
        self.pin_timeout = require_seconds("ServerEvalFn(pin_timeout)", pin_timeout)
        self.grace = require_seconds("ServerEvalFn(grace)", grace)
        self.concurrency = concurrency
        self.retries = retries
        # A launched vLLM server gets actorsys' worker extension, whose reload also rebuilds a
        # tied lm_head: vLLM's own reload leaves its CPU kernel built from the old weights.
        self.tied_reload = (
            self.launch is not None
            and flavor != "sglang"
            and any("vllm" in arg for arg in self.launch)
            and "--worker-extension-cls" not in self.launch
        )
        self.process: ManagedProcess | None = None
        self.log_path: str | None = None
        self._engine: ServerClient | None = None
        self._ready_deadline: float | None = None
        self._lock = trio.Lock()

    def __repr__(self) -> str:
        target = self.url if self.launch is None else f"launch={self.launch!r}"
        return f"ServerEvalFn({[d.name for d in self.datasets]}, {target})"

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
        self, checkpoint_dir: str, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        version = input.weight_version or str(input.rollout_id)
        async with self._lock:
            engine = await self._while_alive(self._ready)
            await self._while_alive(lambda: self._pin(engine, checkpoint_dir, version))
            fleet = Fleet([engine])
            fleet.version = version
            output = await self._while_alive(
                lambda: evaluate_datasets(
                    fleet,
                    self.datasets,
                    concurrency=self.concurrency,
                    request_timeout=self.request_timeout,
                    retries=self.retries,
                )
            )
            served = await self._while_alive(lambda: self._version_now(engine))
            if served != version:
                raise EvalSkip(
                    "pin_violation",
                    f"{engine.url} served version {served!r} after the evaluation of {version!r}"
                    " (reloaded by someone else meanwhile?)",
                )
            return output

    async def dispose(self) -> None:  # type: ignore[override]
        """Stop the launched server, if any (SIGTERM, then SIGKILL after ``grace``); remove
        its log. Shielded: returns within about twice ``grace`` even when cancelled."""
        process, self.process = self.process, None
        self._engine = None
        self._ready_deadline = None
        if process is not None:
            await process.stop(self.grace)
            log.info("stopped the eval server %s (status %s)", process.name, process.returncode)
        if self.log_path is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_remove, self.log_path)
            self.log_path = None

    async def _ready(self) -> ServerClient:
        if self._engine is not None:
            return self._engine
        if self._ready_deadline is None:
            self._ready_deadline = trio.current_time() + self.ready_timeout
            if self.launch is not None:
                self._start()
        assert self.url is not None
        url = self.url
        with trio.move_on_at(self._ready_deadline):
            await _until_ok(lambda: self.make_engine("sglang", url).health())
            self._engine = await _until_ok(lambda: self._detect(url))
            return self._engine
        raise EvalSkip("unhealthy", f"the eval server at {url} was not ready within "
                                    f"{self.ready_timeout} s{self._log_tail()}")

    def _start(self) -> None:
        assert self.launch is not None
        port = free_port()
        # The server listens on loopback only, and takes a key (through its environment,
        # which other users cannot read): ours and vLLM's read it from there.
        argv = on_host([arg.replace("{port}", str(port)) for arg in self.launch], "127.0.0.1")
        self.api_key = self.api_key or _argv_key(self.launch) or new_api_key()
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", ENGINE_API_KEY_ENV: self.api_key,
               VLLM_API_KEY_ENV: self.api_key}
        if self.tied_reload:
            argv += ["--worker-extension-cls", EXTENSION_CLASS]
        if self.flavor != "sglang" and any("vllm" in arg for arg in self.launch):
            argv += ["--middleware", API_KEY_MIDDLEWARE]
            env["PYTHONPATH"] = os.pathsep.join(p for p in (WORKER_DIR, env.get("PYTHONPATH")) if p)
        handle, self.log_path = tempfile.mkstemp(prefix="actorsys-eval-server-", suffix=".log")
        os.close(handle)
        # Forked from this (the evaluating trio) thread: the server lives as long as it.
        self.process = spawn("eval-server", argv, log_path=self.log_path, env=env, grace=self.grace)
        self.url = f"http://127.0.0.1:{port}"
        log.info("launched the eval server %s at %s (log %s)", argv[0], self.url, self.log_path)

    async def _detect(self, url: str) -> ServerClient:
        try:
            return await engine_of_flavor(self.flavor, lambda flavor: self.make_engine(flavor, url))
        except EngineUnhealthyError as exc:
            raise EvalSkip("unhealthy", f"{url} is neither an sglang server nor a vLLM server "
                           f"with its weight-update endpoints ({exc}); pass flavor=") from exc

    async def _pin(self, engine: ServerClient, path: str, version: str) -> None:
        problem = "no answer"
        delay = POLL_INITIAL_DELAY
        with trio.move_on_after(self.pin_timeout):
            while True:
                try:
                    await engine.load_weights(path, version)
                    served = await engine.weight_version()
                except CheckpointRejectedError as exc:
                    raise EvalSkip(exc.reason, str(exc)) from exc
                except EngineUnhealthyError as exc:
                    problem = str(exc)
                else:
                    if served == version:
                        return
                    problem = f"it serves version {served!r}"
                log.info("%s: not pinned to %s yet (%s); retrying in %.1f s", engine.url,
                         version, problem, delay)
                await trio.sleep(delay)
                delay = min(delay * 2, POLL_MAX_DELAY)
        raise EvalSkip("pin_violation", f"{engine.url} did not serve version {version!r} within "
                                        f"{self.pin_timeout} s: {problem}")

    async def _version_now(self, engine: ServerClient) -> str | None:
        with trio.move_on_after(self.request_timeout):
            try:
                return await engine.weight_version()
            except EngineUnhealthyError as exc:
                raise EvalSkip("unhealthy", f"{engine.url} could not report its version after "
                                            f"the evaluation: {exc}") from exc
        raise EvalSkip("unhealthy", f"{engine.url} did not report its version within "
                                    f"{self.request_timeout} s after the evaluation")

    async def _while_alive(self, call: Callable[[], Awaitable[T]]) -> T:
        """``await call()``, cut short by the launched server's death (``unhealthy``)."""
        process = self.process
        if process is None:
            return await call()
        if process.returncode is not None:
            raise self._died(process)
        result: list[T] = []
        error: list[Exception] = []

        async def run(cancel_scope: trio.CancelScope) -> None:
            try:
                result.append(await call())
            except Exception as exc:
                error.append(exc)
            cancel_scope.cancel()

        async def watch(cancel_scope: trio.CancelScope) -> None:
            await process.wait()
            cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, nursery.cancel_scope)
            nursery.start_soon(watch, nursery.cancel_scope)
        if error:
            raise error[0]
        if not result:
            raise self._died(process)
        return result[0]

    def _died(self, process: ManagedProcess) -> EvalSkip:
        return EvalSkip("unhealthy", f"the launched eval server exited with status "
                                     f"{process.returncode}{self._log_tail()}")

    def _log_tail(self) -> str:
        tail = self.process.log_tail(2000) if self.process is not None else ""
        return f"; its log ends:\n{tail}" if tail else ""


async def _until_ok(call: Callable[[], Awaitable[T]]) -> T:
    """``await call()`` until it does not raise :class:`EngineUnhealthyError` (a server still
    starting refuses connections); the caller's cancel scope bounds it."""
    delay = POLL_INITIAL_DELAY
    while True:
        try:
            return await call()
        except EngineUnhealthyError as exc:
            log.debug("eval server not ready: %s", exc)
        await trio.sleep(delay)
        delay = min(delay * 2, POLL_MAX_DELAY)


def _argv_key(argv: Sequence[str]) -> str | None:
    """The value of ``--api-key`` in ``argv`` (the key a server launched with it requires)."""
    for index, arg in enumerate(argv):
        if arg.startswith("--api-key="):
            return arg.partition("=")[2] or None
        if arg == "--api-key" and index + 1 < len(argv):
            return argv[index + 1]
    return None


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass

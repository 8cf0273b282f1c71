"""InspectTasks: inspect-ai tasks (agents, tools, scorers) evaluated at each point on the
pinned fleet.

::

    eval_fn = InspectTasks([my_task(), "tasks/agent.py@math_agent"], limit=50,
                           generate_config={"max_tokens": 256, "temperature": 0})
    async with EvalSupervisor.open(config, eval_fn=eval_fn, fleet=fleet) as sup: ...

Every point runs ``inspect_ai.eval_async`` with inspect's OpenAI-compatible provider
(``openai-api``) whose base URL is this evaluation's door to the fleet (a loopback
:class:`~actorsys.evals._door.gate.RequestGate`): answers are held to the pinned version, and the
door closes when the evaluation ends or is cut, so nothing of a cut run reaches the next step's
weights. Inspect runs on a private asyncio loop in its own thread (the host's asyncio is never
touched); cutting the evaluation cancels it there. Inspect allows one ``eval_async`` per
process at a time, so the evaluations of every InspectTasks in a process take turns.

Metrics: ``eval/<task>/<scorer>/<metric>`` (``eval/arith/match/accuracy``); where the scorer
has inspect's ``stderr`` metric, it is also ``eval/<task>/<scorer>/<mean>/stderr`` beside its
``accuracy`` or ``mean``. ``data["inspect"]``
holds, per task, the run's status and every sample's record (input, target, output, scores,
error); with ``log_dir`` inspect's own log files are kept there too (their paths in the data),
otherwise they are written to a temporary directory and removed. A task that fails (its solver
or scorer raised, or too many samples errored) skips the point as ``crashed`` with inspect's
error in ``data["error"]``; a fleet that failed the requests skips it as ``unhealthy``.

Offline: the provider talks only to the door; no key, no base URL or model is read from the
environment. Needs the extra ``inspect``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from actorsys._errors import ConfigError
from actorsys.contracts import (
    CheckpointEvalFn,
    EvalSkip,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
    model_files,
)
from actorsys.evals._door.door import FleetDoor
from actorsys.evals.harnesses.openai_eval import CLIENT_KEY
from actorsys.runtime import AsyncioThread

SERVICE = "actorsys"
"""The service part of the provider's model name (``openai-api/actorsys/<model>``)."""
SAMPLE_FIELDS = ("id", "epoch", "input", "target", "output", "scores", "error", "metadata")
MEAN_METRICS = ("accuracy", "mean")
"""The inspect metrics a scorer's ``stderr`` is the standard error of."""


class InspectTasks(CheckpointEvalFn):
    """A :class:`~actorsys.CheckpointEvalFn` that runs inspect-ai ``tasks`` (``Task`` objects,
    or what ``inspect_ai.eval`` takes: registry names, ``file.py@task``).

    ``limit`` (samples per task) and ``epochs`` are inspect's own. ``generate_config``: a dict
    of inspect's ``GenerateConfig`` fields, or one (``max_tokens``, ``temperature``,
    ``max_connections``...). ``log_dir``: where inspect's log files of every point are kept
    (None: only the records in the point's data). ``eval_options``: further keyword arguments
    of ``inspect_ai.eval_async`` (``fail_on_error``, ``message_limit``...).
    """

    def __init__(
        self,
        tasks: Any,
        *,
        limit: int | None = None,
        epochs: int | None = None,
        generate_config: Any = None,
        log_dir: str | os.PathLike[str] | None = None,
        eval_options: Mapping[str, Any] | None = None,
    ) -> None:
        if importlib.util.find_spec("inspect_ai") is None:
            raise ConfigError("InspectTasks", "needs inspect-ai: pip install 'actorsys[inspect]'")
        if tasks is None or (isinstance(tasks, Sequence) and not isinstance(tasks, str) and not tasks):
            raise ConfigError("tasks", "expected an inspect task, a task name, or a non-empty list of them")
        self.tasks = tasks
        self.limit = _positive("limit", limit)
        self.epochs = _positive("epochs", epochs)
        self.generate_config = _generate_config(generate_config)
        self.log_dir = None if log_dir is None else os.path.abspath(log_dir)
        self.eval_options = dict(eval_options or {})

    async def evaluate_checkpoint(
        self, checkpoint_dir: str | None, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        """Run the tasks on ``input.fleet`` through the door; see the class docstring."""
        door = FleetDoor(input.fleet, model_files(checkpoint_dir, input), who="InspectTasks")

        async def work(url: str, model: str) -> Any:
            return await _INSPECT.run(self._eval(url, model, input.rollout_id))

        try:
            return await door.run(work)
        except EvalSkip:
            raise
        except Exception as error:
            if door.statistics().upstream_errors:
                detail = f"the fleet at {', '.join(door.upstreams)} failed inspect's requests: {error!r}"
                raise EvalSkip("unhealthy", detail) from error
            raise

    async def _eval(self, url: str, model: str, step: int) -> RolloutFnEvalOutput:
        """On inspect's loop: one ``eval_async`` of the tasks against the door, and its
        output (inspect reads its logs back only from an asyncio context)."""
        from inspect_ai import eval_async
        from inspect_ai.model import get_model

        provider = get_model(
            f"openai-api/{SERVICE}/{model}",
            base_url=f"{url}/v1",
            api_key=CLIENT_KEY,
            config=self.generate_config,
            memoize=False,
        )
        log_dir = self.log_dir
        if log_dir is None:
            log_dir = await asyncio.to_thread(tempfile.mkdtemp, prefix="actorsys-inspect-")
        options = {
            "ctl_server": False,
            "log_samples": True,
            "score_display": False,
            "tags": [f"step-{step}"],
            **self.eval_options,
        }
        try:
            logs: list[Any] = await eval_async(
                self.tasks,
                model=provider,
                limit=self.limit,
                epochs=self.epochs,
                log_dir=log_dir,
                **options,
            )
            return output_of(logs, kept_logs=self.log_dir is not None)
        finally:
            if self.log_dir is None:
                await asyncio.to_thread(shutil.rmtree, log_dir, True)


class _InspectLoop:
    """The one asyncio loop inspect runs on in this process, and the turn each evaluation
    waits for there: inspect refuses a second ``eval_async`` while one runs, and a cut one
    still unwinds on the loop after the evaluation that started it has given up on it."""

    def __init__(self) -> None:
        self._thread = AsyncioThread(name="actorsys-inspect")
        self._lock: asyncio.Lock | None = None
        self._guard = threading.Lock()

    async def run(self, coro: Any) -> Any:
        return await self._thread.run(self._in_turn(coro))

    async def _in_turn(self, coro: Any) -> Any:
        with self._guard:
            if self._lock is None:
                self._lock = asyncio.Lock()
            lock = self._lock
        try:
            async with lock:
                return await coro
        finally:
            coro.close()


_INSPECT = _InspectLoop()


def output_of(logs: Sequence[Any], *, kept_logs: bool) -> RolloutFnEvalOutput:
    """Metrics ``eval/<task>/<scorer>/<metric>`` and per-task records from inspect's logs;
    :class:`EvalSkip` ``crashed`` (inspect's error in the detail) if a task did not succeed."""
    metrics: dict[str, float] = {}
    tasks: dict[str, Any] = {}
    failures = []
    for log in logs:
        task = str(log.eval.task)
        record: dict[str, Any] = {
            "status": str(log.status),
            "samples": [_sample(sample) for sample in (log.samples or [])],
        }
        if kept_logs:
            record["log"] = str(log.location)
        if log.error is not None:
            record["error"] = str(log.error.message)
            failures.append(f"{task}: {log.error.message}")
        elif log.status != "success":
            failures.append(f"{task}: the run ended {log.status}")
        tasks[task] = record
        for score in (log.results.scores if log.results else []):
            for name, metric in score.metrics.items():
                value = metric.value
                if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                    metrics[f"eval/{task}/{score.name}/{name}"] = float(value)
            # inspect's stderr metric is the standard error of the mean score (over samples,
            # each reduced over its epochs first): named as every stderr of ours, after its mean
            stderr = metrics.get(f"eval/{task}/{score.name}/stderr")
            for name in MEAN_METRICS:
                if stderr is not None and f"eval/{task}/{score.name}/{name}" in metrics:
                    metrics[f"eval/{task}/{score.name}/{name}/stderr"] = stderr
    if failures:
        raise EvalSkip("crashed", "inspect: " + "; ".join(failures))
    return RolloutFnEvalOutput(data={"inspect": tasks}, metrics=metrics)


def _sample(sample: Any) -> dict[str, Any]:
    record: dict[str, Any] = sample.model_dump(mode="json", include=set(SAMPLE_FIELDS))
    record["output"] = sample.output.completion if sample.output is not None else None
    return record


def _generate_config(value: Any) -> Any:
    from inspect_ai.model import GenerateConfig

    if value is None:
        return GenerateConfig()
    if isinstance(value, GenerateConfig):
        return value
    if not isinstance(value, Mapping):
        message = f"expected a dict of GenerateConfig fields or one, got {value!r}"
        raise ConfigError("generate_config", message)
    unknown = set(value) - set(GenerateConfig.model_fields)
    if unknown:
        raise ConfigError("generate_config", f"not fields of inspect's GenerateConfig: {sorted(unknown)}")
    try:
        return GenerateConfig(**value)
    except ValueError as exc:
        raise ConfigError("generate_config", str(exc)) from exc


def _positive(field: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(field, f"expected an integer >= 1 or None, got {value!r}")
    return value

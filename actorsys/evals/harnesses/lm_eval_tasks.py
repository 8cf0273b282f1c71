"""LmEvalTasks: lm-evaluation-harness tasks, scored on the pinned fleet by lm-eval itself.

::

    eval_fn = LmEvalTasks(["gsm8k", "my_task"], include_path="tasks/", limit=200)
    async with EvalSupervisor.open(config, eval_fn=eval_fn, fleet=fleet) as sup: ...

Every point runs ``lm_eval.simple_evaluate`` with lm-eval's own ``local-completions`` model,
so the prompts, the few-shot contexts and the scoring are the harness' and the numbers are the
ones users already compare. The snapshot directory is its tokenizer (tokens are counted and
truncated exactly as the served model sees them); requests go through a :class:`RequestGate`
to the fleet's router, or round-robin over its engines. Needs the extra ``lm-eval``. The
snapshot's files are checked and read in worker threads (``run_blocking``), never on the trio
thread.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from actorsys._errors import ConfigError
from actorsys._flags import require_int, require_seconds
from actorsys.contracts import (
    CheckpointEvalFn,
    EvalSkip,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
    model_files,
)
from actorsys.evals._door.door import FleetDoor
from actorsys.fleet.clients.completions import StaleWeightsError
from actorsys.runtime import ThreadTracker, run_blocking

LENGTH_FIELDS = ("n_positions", "max_position_embeddings", "n_ctx")
DEFAULT_MAX_LENGTH = 2048
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
STDERR_SUFFIX = "_stderr"
"""lm-eval names the standard error of ``<metric>`` ``<metric>_stderr``."""


class LmEvalTasks(CheckpointEvalFn):
    """A :class:`~actorsys.CheckpointEvalFn` that runs lm-evaluation-harness ``tasks`` (names,
    groups or tags lm-eval knows, and those of the task YAMLs under ``include_path``).

    ``num_fewshot``, ``limit`` (documents per task: a count, or a fraction below 1) and
    ``gen_kwargs`` (overrides for generation tasks, a dict or ``"k=v,..."``) are lm-eval's own.
    ``num_concurrent`` bounds the requests in flight. ``log_samples`` keeps lm-eval's
    per-sample records in ``outcome.data["samples"][task]``. ``request_timeout`` is lm-eval's
    deadline per request (it retries a failed request ``max_retries`` times).

    Metrics: ``eval/<task>/<metric>`` for filter ``none`` and ``eval/<task>/<metric>/<filter>``
    otherwise (``acc``, ``exact_match/strict-match``...), groups included; lm-eval's own
    standard error of each (its ``<metric>_stderr``, where it computes one) is
    ``eval/<task>/<metric>[/<filter>]/stderr``.
    lm-eval's seeding of the global ``random``/numpy/torch generators is off: it runs in the
    trainer's process, whose generators it must not reset.

    Blocking and cancellation: each evaluation runs lm-eval in a worker thread and waits for
    it. When the evaluation is cut (``eval_timeout``, close) the thread is abandoned, and the
    gate it talks through is closed before the fleet is handed back, so no request of the
    abandoned run reaches an engine after that; the thread itself ends once its requests have
    failed (after lm-eval's retries, a few seconds). ``statistics()`` lists threads still running.
    """

    def __init__(
        self,
        tasks: str | Sequence[str | Mapping[str, Any]],
        *,
        include_path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
        num_fewshot: int | None = None,
        limit: int | float | None = None,
        num_concurrent: int = 8,
        gen_kwargs: Mapping[str, Any] | str | None = None,
        log_samples: bool = False,
        batch_size: int = 1,
        request_timeout: float = 300.0,
        max_retries: int = 3,
    ) -> None:
        if importlib.util.find_spec("lm_eval") is None:
            raise ConfigError("LmEvalTasks", "needs lm-evaluation-harness: pip install 'actorsys[lm-eval]'")
        self.tasks = _tasks(tasks)
        self.include_path = _include_path(include_path)
        self.num_fewshot = _count("num_fewshot", num_fewshot, minimum=0)
        self.limit = _limit(limit)
        self.num_concurrent = _count("num_concurrent", num_concurrent, minimum=1)
        if gen_kwargs is not None and not isinstance(gen_kwargs, str | Mapping):
            message = f"expected a dict, a 'k=v,...' string or None, got {gen_kwargs!r}"
            raise ConfigError("gen_kwargs", message)
        self.gen_kwargs = dict(gen_kwargs) if isinstance(gen_kwargs, Mapping) else gen_kwargs
        self.log_samples = bool(log_samples)
        self.batch_size = _count("batch_size", batch_size, minimum=1)
        self.request_timeout = require_seconds("request_timeout", request_timeout)
        self.max_retries = _count("max_retries", max_retries, minimum=1)
        self._tracker = ThreadTracker()
        self._limiter = trio.CapacityLimiter(math.inf)
        self._task_manager: Any = None
        self._task_manager_lock = threading.Lock()

    def statistics(self) -> dict[str, list[str]]:
        """``threads``: the lm-eval runs still running, abandoned ones included."""
        return {"threads": self._tracker.running()}

    async def evaluate_checkpoint(
        self, checkpoint_dir: str | None, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        """Score the tasks on ``input.fleet`` (pinned to ``checkpoint_dir``, or for a served
        point to the weights it serves, with the tokenizer of ``input.base_checkpoint``). Blocks on lm-eval
        in a worker thread; raises :class:`~actorsys.EvalSkip` ``pin_violation`` if an engine
        answered with other weights, ``unhealthy`` if the fleet failed lm-eval's requests."""
        files = model_files(checkpoint_dir, input)
        if files is None:
            raise ConfigError(
                "EvalConfig.base_checkpoint", "LmEvalTasks reads the model's tokenizer, and a "
                "served point has no checkpoint: set base_checkpoint to the model's HF dir",
            )
        door = FleetDoor(input.fleet, files, who="LmEvalTasks")
        max_length = await run_blocking(
            lambda: _tokenizer_context(files),
            abandon_on_cancel=True,
            limiter=self._limiter,
            description=f"read the tokenizer and config of {files}",
            tracker=self._tracker,
        )

        async def work(url: str, model: str) -> Any:
            model_args = {
                "base_url": f"{url}/v1/completions",
                "model": model,
                "tokenizer": files,
                "tokenizer_backend": "huggingface",
                "num_concurrent": self.num_concurrent,
                "max_retries": self.max_retries,
                "timeout": self.request_timeout,
                "max_length": max_length,
            }
            return await run_blocking(
                lambda: self._simple_evaluate(model_args),
                abandon_on_cancel=True,
                limiter=self._limiter,
                description=f"lm-eval of step {input.rollout_id}",
                tracker=self._tracker,
                # lm-eval waits on requests the gate serves in trio, whose timeouts are
                # trio's: virtual time must pass while it runs.
                hold_clock=False,
            )

        try:
            results = await door.run(work)
        except StaleWeightsError:
            raise
        except Exception as error:
            if door.statistics().upstream_errors:
                detail = (
                    f"the fleet at {', '.join(door.upstreams)} failed lm-eval's requests: {error!r}"
                )
                raise EvalSkip("unhealthy", detail) from error
            raise
        if results is None:
            raise EvalSkip("crashed", "lm-eval returned no results")
        return output_of(results, log_samples=self.log_samples)

    def _simple_evaluate(self, model_args: dict[str, Any]) -> Any:
        import lm_eval

        return lm_eval.simple_evaluate(
            model="local-completions",
            model_args=model_args,
            tasks=list(self.tasks),
            num_fewshot=self.num_fewshot,
            limit=self.limit,
            gen_kwargs=self.gen_kwargs,
            batch_size=self.batch_size,
            task_manager=self.load_tasks(),
            log_samples=self.log_samples,
            random_seed=None,
            numpy_random_seed=None,
            torch_random_seed=None,
        )

    def load_tasks(self) -> Any:
        """lm-eval's task index (its TaskManager), built at the first call: it reads every
        task YAML lm-eval ships and those under ``include_path``, which takes seconds. Call it
        in a thread at start-up to keep that out of the first evaluation. Thread-safe."""
        with self._task_manager_lock:
            if self._task_manager is None:
                from lm_eval.tasks import TaskManager

                self._task_manager = TaskManager(include_path=self.include_path)
            return self._task_manager


def output_of(results: Mapping[str, Any], *, log_samples: bool) -> RolloutFnEvalOutput:
    """Metrics named ``eval/<task>/<metric>[/<filter>]`` from ``simple_evaluate``'s results;
    ``data`` keeps lm-eval's versions and sample counts (and the samples, when asked)."""
    metrics: dict[str, float] = {}
    for section in ("results", "groups"):
        for task, values in (results.get(section) or {}).items():
            for key, value in values.items():
                metric, comma, name = key.partition(",")
                if not comma or isinstance(value, bool) or not isinstance(value, int | float):
                    continue
                if math.isfinite(value):
                    suffix = "" if name == "none" else f"/{name}"
                    # lm-eval's own standard error of <metric> is "<metric>_stderr": named
                    # eval/<task>/<metric>[/<filter>]/stderr, as every stderr of ours is
                    base = metric.removesuffix(STDERR_SUFFIX)
                    if base and base != metric:
                        metrics[f"eval/{task}/{base}{suffix}/stderr"] = float(value)
                    else:
                        metrics[f"eval/{task}/{metric}{suffix}"] = float(value)
    data: dict[str, Any] = {
        "lm_eval": {
            "versions": dict(results.get("versions") or {}),
            "n_samples": dict(results.get("n-samples") or {}),
        }
    }
    if log_samples:
        data["samples"] = json.loads(json.dumps(results.get("samples") or {}, default=repr))
    return RolloutFnEvalOutput(data=data, metrics=metrics)


def _tokenizer_context(checkpoint_dir: str) -> int:
    """The context length lm-eval may use with ``checkpoint_dir``; raises
    :class:`~actorsys.EvalSkip` ``ckpt_invalid`` if it holds no tokenizer. Blocking."""
    _require_tokenizer(checkpoint_dir)
    return _max_length(checkpoint_dir)


def _max_length(checkpoint_dir: str) -> int:
    """The context length lm-eval's ``hf`` model reads from the same config (so both truncate
    alike, and no request exceeds the served model's positions)."""
    try:
        with open(os.path.join(checkpoint_dir, "config.json"), encoding="utf-8") as file:
            config = json.load(file)
    except (OSError, ValueError):
        return DEFAULT_MAX_LENGTH
    for field in LENGTH_FIELDS:
        value = config.get(field) or (config.get("text_config") or {}).get(field)
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_MAX_LENGTH


def _require_tokenizer(checkpoint_dir: str) -> None:
    if not any(os.path.exists(os.path.join(checkpoint_dir, name)) for name in TOKENIZER_FILES):
        raise EvalSkip(
            "ckpt_invalid",
            f"{checkpoint_dir} holds no tokenizer for lm-eval; export it with "
            "EvalConfig(base_checkpoint=...) so its tokenizer files are copied in",
        )


def _tasks(tasks: Any) -> tuple[str | dict[str, Any], ...]:
    if isinstance(tasks, str):
        tasks = [tasks]
    if (
        not isinstance(tasks, Sequence)
        or not tasks
        or not all(isinstance(t, str) and t or isinstance(t, Mapping) for t in tasks)
    ):
        raise ConfigError("tasks", f"expected a task name or a non-empty list of names, got {tasks!r}")
    return tuple(t if isinstance(t, str) else dict(t) for t in tasks)


def _include_path(path: Any) -> str | list[str] | None:
    if path is None:
        return None
    paths = [path] if isinstance(path, str | os.PathLike) else list(path)
    for entry in paths:
        if not os.path.isdir(entry):
            raise ConfigError("include_path", f"{os.fspath(entry)!r} is not a directory of task YAMLs")
    resolved = [os.path.abspath(entry) for entry in paths]
    return resolved[0] if isinstance(path, str | os.PathLike) else resolved


def _count(field: str, value: Any, *, minimum: int) -> Any:
    if value is None and field == "num_fewshot":
        return None
    return require_int(field, value, minimum=minimum)


def _limit(limit: Any) -> int | float | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int | float) or not limit > 0:
        raise ConfigError("limit", f"expected a document count >= 1 or a fraction in (0, 1), got {limit!r}")
    if isinstance(limit, float) and limit >= 1 and not limit.is_integer():
        raise ConfigError("limit", f"a fraction must lie in (0, 1), got {limit!r}")
    return int(limit) if limit >= 1 else limit

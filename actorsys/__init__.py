"""actorsys: non-blocking, supervised evaluation for RL and LLM post-training, on trio.

Every public name is imported when first used (:mod:`actorsys._lazy`), so importing one module
of the package (``actorsys.evals.scoring.scorers`` in a scoring worker) imports that module only.
:data:`PUBLIC` is the one list of the public names and the modules that define them: the
lazy imports derive from it; ``__all__`` (spelled out, as documentation tools read it without
running the code) and the imports under ``TYPE_CHECKING`` (what type checkers and editors
read) are checked against it by tests/test_public_api.py.
"""

from typing import TYPE_CHECKING

from actorsys import flag_groups
from actorsys._lazy import lazy_names

PUBLIC: dict[str, str] = {
    "ActorsysError": "actorsys._errors",
    "BaseRolloutFn": "actorsys.contracts",
    "CheckpointEvalFn": "actorsys.contracts",
    "BestPoint": "actorsys.outcome",
    "CloseReport": "actorsys.outcome",
    "ConfigError": "actorsys._errors",
    "DatasetError": "actorsys._errors",
    "DatasetEval": "actorsys.evals.harnesses.dataset_eval",
    "DrainReport": "actorsys.outcome",
    "DuplicateStepError": "actorsys._errors",
    "Engine": "actorsys.fleet.protocol",
    "EngineUnhealthyError": "actorsys._errors",
    "EvalConfig": "actorsys.config",
    "EvalDataset": "actorsys.evals.data.dataset",
    "EvalSkip": "actorsys._errors",
    "EvalSupervisor": "actorsys._core.supervisor",
    "Fleet": "actorsys.fleet.fleet",
    "JsonlSink": "actorsys.sinks.jsonl",
    "LmEvalTasks": "actorsys.evals.harnesses.lm_eval_tasks",
    "MemorySink": "actorsys.sinks.memory",
    "Outcome": "actorsys.outcome",
    "PinError": "actorsys._errors",
    "PinViolationError": "actorsys._errors",
    "RolloutFnConstructorInput": "actorsys.contracts",
    "RolloutFnEvalInput": "actorsys.contracts",
    "RolloutFnEvalOutput": "actorsys.contracts",
    "RolloutFnTrainInput": "actorsys.contracts",
    "RolloutFnTrainOutput": "actorsys.contracts",
    "SGLangEngine": "actorsys.fleet.clients.sglang",
    "ServerEvalFn": "actorsys.evals.harnesses.server",
    "StagingInUseError": "actorsys._errors",
    "SubmitError": "actorsys._errors",
    "SupervisorClosedError": "actorsys._errors",
    "SupervisorGaveUpError": "actorsys._errors",
    "SupervisorStatistics": "actorsys.outcome",
    "TensorBoardSink": "actorsys.sinks.tensorboard",
    "UnsupportedModelError": "actorsys._errors",
    "VLLMEngine": "actorsys.fleet.clients.vllm",
    "WandbSink": "actorsys.sinks.wandb",
    "WatchOutInUseError": "actorsys._errors",
    "datasets_from_args": "actorsys.evals.data.flags",
    "load_eval_config": "actorsys.evals.data.eval_config",
    "score": "actorsys.evals.scoring.scorers",
}
"""Each public name of ``actorsys`` and the module that defines it."""

__all__ = [  # sorted(PUBLIC), spelled out for static tools (mkdocstrings); the tests check it
    "ActorsysError",
    "BaseRolloutFn",
    "BestPoint",
    "CheckpointEvalFn",
    "CloseReport",
    "ConfigError",
    "DatasetError",
    "DatasetEval",
    "DrainReport",
    "DuplicateStepError",
    "Engine",
    "EngineUnhealthyError",
    "EvalConfig",
    "EvalDataset",
    "EvalSkip",
    "EvalSupervisor",
    "Fleet",
    "JsonlSink",
    "LmEvalTasks",
    "MemorySink",
    "Outcome",
    "PinError",
    "PinViolationError",
    "RolloutFnConstructorInput",
    "RolloutFnEvalInput",
    "RolloutFnEvalOutput",
    "RolloutFnTrainInput",
    "RolloutFnTrainOutput",
    "SGLangEngine",
    "ServerEvalFn",
    "StagingInUseError",
    "SubmitError",
    "SupervisorClosedError",
    "SupervisorGaveUpError",
    "SupervisorStatistics",
    "TensorBoardSink",
    "UnsupportedModelError",
    "VLLMEngine",
    "WandbSink",
    "WatchOutInUseError",
    "datasets_from_args",
    "load_eval_config",
    "score",
]
__getattr__, __dir__ = lazy_names(__name__, PUBLIC)

if TYPE_CHECKING:  # the same names, for type checkers (tests/test_public_api.py checks them)
    from actorsys._core.supervisor import EvalSupervisor
    from actorsys._errors import (
        ActorsysError,
        ConfigError,
        DatasetError,
        DuplicateStepError,
        EngineUnhealthyError,
        EvalSkip,
        PinError,
        PinViolationError,
        StagingInUseError,
        SubmitError,
        SupervisorClosedError,
        SupervisorGaveUpError,
        UnsupportedModelError,
        WatchOutInUseError,
    )
    from actorsys.config import EvalConfig
    from actorsys.contracts import (
        BaseRolloutFn,
        CheckpointEvalFn,
        RolloutFnConstructorInput,
        RolloutFnEvalInput,
        RolloutFnEvalOutput,
        RolloutFnTrainInput,
        RolloutFnTrainOutput,
    )
    from actorsys.evals.data.dataset import EvalDataset
    from actorsys.evals.data.eval_config import load_eval_config
    from actorsys.evals.data.flags import datasets_from_args
    from actorsys.evals.harnesses.dataset_eval import DatasetEval
    from actorsys.evals.harnesses.lm_eval_tasks import LmEvalTasks
    from actorsys.evals.harnesses.server import ServerEvalFn
    from actorsys.evals.scoring.scorers import score
    from actorsys.fleet.clients.sglang import SGLangEngine
    from actorsys.fleet.clients.vllm import VLLMEngine
    from actorsys.fleet.fleet import Fleet
    from actorsys.fleet.protocol import Engine
    from actorsys.outcome import BestPoint, CloseReport, DrainReport, Outcome, SupervisorStatistics
    from actorsys.sinks.jsonl import JsonlSink
    from actorsys.sinks.memory import MemorySink
    from actorsys.sinks.tensorboard import TensorBoardSink
    from actorsys.sinks.wandb import WandbSink


def _import_flag_features() -> None:
    """Import the features whose trainer flags ``EvalConfig.add_arguments`` adds (they
    register them with :mod:`actorsys.flag_groups`): the package, a layer above them, names
    them here, and the config calls this on first need, whatever was imported before."""
    import actorsys.evals.data.flags  # noqa: F401
    import actorsys.fleet.flags  # noqa: F401


flag_groups.on_first_use(_import_flag_features)

"""actorsys: non-blocking, supervised evaluation for RL and LLM post-training, on trio.

Every public name is imported when first used (:mod:`actorsys._lazy`), so importing one module
of the package (``actorsys.evals.scoring.scorers`` in a scoring worker) imports that module only.
"""

from typing import TYPE_CHECKING

from actorsys._lazy import lazy_names

if TYPE_CHECKING:
    from actorsys._errors import (
        ActorsysError,
        ConfigError,
        DuplicateStepError,
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
        EvalSkip,
        RolloutFnConstructorInput,
        RolloutFnEvalInput,
        RolloutFnEvalOutput,
        RolloutFnTrainInput,
        RolloutFnTrainOutput,
    )
    from actorsys.evals.data.dataset import DatasetError, EvalDataset
    from actorsys.evals.data.eval_config import load_eval_config
    from actorsys.evals.data.flags import datasets_from_args
    from actorsys.evals.harnesses.dataset_eval import DatasetEval
    from actorsys.evals.harnesses.lm_eval_tasks import LmEvalTasks
    from actorsys.evals.harnesses.server import ServerEvalFn
    from actorsys.evals.scoring.scorers import score
    from actorsys.fleet.clients.sglang import SGLangEngine
    from actorsys.fleet.clients.vllm import VLLMEngine
    from actorsys.fleet.fleet import Engine, EngineUnhealthyError, Fleet, PinError, PinViolationError
    from actorsys.outcome import BestPoint, CloseReport, DrainReport, Outcome, SupervisorStatistics
    from actorsys.sinks import JsonlSink, MemorySink
    from actorsys.sinks.tensorboard import TensorBoardSink
    from actorsys.sinks.wandb import WandbSink
    from actorsys.supervisor import EvalSupervisor

__all__ = [
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

__getattr__, __dir__ = lazy_names(
    __name__,
    {
        "ActorsysError": "actorsys._errors",
        "BaseRolloutFn": "actorsys.contracts",
        "BestPoint": "actorsys.outcome",
        "CheckpointEvalFn": "actorsys.contracts",
        "CloseReport": "actorsys.outcome",
        "ConfigError": "actorsys._errors",
        "DatasetError": "actorsys.evals.data.dataset",
        "DatasetEval": "actorsys.evals.harnesses.dataset_eval",
        "DrainReport": "actorsys.outcome",
        "DuplicateStepError": "actorsys._errors",
        "Engine": "actorsys.fleet.fleet",
        "EngineUnhealthyError": "actorsys.fleet.fleet",
        "EvalConfig": "actorsys.config",
        "EvalDataset": "actorsys.evals.data.dataset",
        "EvalSkip": "actorsys.contracts",
        "EvalSupervisor": "actorsys.supervisor",
        "Fleet": "actorsys.fleet.fleet",
        "JsonlSink": "actorsys.sinks",
        "LmEvalTasks": "actorsys.evals.harnesses.lm_eval_tasks",
        "MemorySink": "actorsys.sinks",
        "Outcome": "actorsys.outcome",
        "PinError": "actorsys.fleet.fleet",
        "PinViolationError": "actorsys.fleet.fleet",
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
    },
)

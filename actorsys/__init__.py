"""actorsys: non-blocking, supervised evaluation for RL and LLM post-training, on trio."""

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
from actorsys.evals import (
    DatasetError,
    DatasetEval,
    EvalDataset,
    LmEvalTasks,
    ServerEvalFn,
    datasets_from_args,
    load_eval_config,
    score,
)
from actorsys.fleet import (
    Engine,
    EngineUnhealthyError,
    Fleet,
    PinError,
    PinViolationError,
    SGLangEngine,
    VLLMEngine,
)
from actorsys.outcome import CloseReport, DrainReport, Outcome, SupervisorStatistics
from actorsys.sinks import JsonlSink, MemorySink
from actorsys.sinks.tensorboard import TensorBoardSink
from actorsys.sinks.wandb import WandbSink
from actorsys.supervisor import EvalSupervisor

__all__ = [
    "ActorsysError",
    "BaseRolloutFn",
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

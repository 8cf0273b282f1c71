import actorsys

EXPECTED = {
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
    "SubmitError",
    "SupervisorClosedError",
    "SupervisorGaveUpError",
    "SupervisorStatistics",
    "TensorBoardSink",
    "VLLMEngine",
    "WandbSink",
    "datasets_from_args",
    "load_eval_config",
    "score",
}


def test_all_is_pinned() -> None:
    assert set(actorsys.__all__) == EXPECTED


def test_every_public_name_is_importable() -> None:
    for name in actorsys.__all__:
        assert getattr(actorsys, name) is not None


def test_every_error_has_the_one_root() -> None:
    for name in ("ConfigError", "DatasetError", "SubmitError", "DuplicateStepError", "SupervisorClosedError",
                 "SupervisorGaveUpError", "PinError", "EngineUnhealthyError", "PinViolationError"):
        assert issubclass(getattr(actorsys, name), actorsys.ActorsysError)

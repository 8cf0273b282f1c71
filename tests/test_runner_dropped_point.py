"""A point dropped after the runner took it but before its eval task started is never
evaluated (close or give-up can settle it in between)."""

from __future__ import annotations

from typing import Any

from actorsys import EvalConfig, MemorySink, RolloutFnEvalInput
from actorsys._pipeline import Pipeline
from actorsys._point import Point, Source, Stage
from actorsys.actors.runner import _evaluate


async def test_a_point_settled_before_its_eval_task_starts_is_not_evaluated() -> None:
    sink = MemorySink()
    pipeline = Pipeline(EvalConfig(), sink, [None], None)
    point = Point(4, Source.CHECKPOINT, checkpoint="/ckpt/4", snapshot="/ckpt/4", stage=Stage.EVAL)
    pipeline.in_flight[point.step] = point
    evaluated: list[str] = []

    async def invoke(checkpoint_dir: str, input: RolloutFnEvalInput) -> Any:  # noqa: A002
        evaluated.append(checkpoint_dir)
        return {}

    assert pipeline.settle_now("closed") == [4]
    await _evaluate(pipeline, point, pipeline.retire_send, invoke)  # type: ignore[arg-type]

    assert evaluated == []
    assert [(o.step, o.reason) for o in sink.outcomes] == [(4, "closed")]

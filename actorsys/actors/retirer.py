"""Retirer: settles every point exactly once, records its outcome, retires its snapshot."""

from __future__ import annotations

import trio

from actorsys._pipeline import Pipeline
from actorsys._point import Point, Stage

NAME = "retirer"


async def run_retirer(pipeline: Pipeline, inbox: trio.MemoryReceiveChannel[Point]) -> None:
    async with inbox:
        async for point in inbox:
            if point.stage is Stage.SETTLED:
                continue
            with pipeline.hold(point, NAME):
                pipeline.settle(point)

"""OpenAIEvalFn: an evaluation written against the OpenAI SDK, run on the pinned fleet.

Agent loops, multi-turn environments and LLM-as-a-judge evaluations are written against one
interface, an OpenAI-compatible chat endpoint. Subclass :class:`OpenAIEvalFn` and write the
loop with the ``client`` it hands you::

    class Calculator(OpenAIEvalFn):
        async def evaluate_with_client(self, client, model, input):
            answer = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "2+2?"}], max_tokens=8
            )
            correct = "4" in (answer.choices[0].message.content or "")
            return RolloutFnEvalOutput(metrics={"eval/calc/acc": float(correct)})

``client`` is an ``openai.AsyncOpenAI`` whose ``base_url`` is this evaluation's door to the
fleet (a loopback :class:`~actorsys.evals._door.gate.RequestGate`), never an engine: every answer is
held to the pinned version (an answer from other weights fails the point as
``pin_violation``), the fleet's key is added by the door (the client never holds it), and the
door closes when the evaluation ends or is cut (``eval_timeout``, close), so a client that
outlives its evaluation cannot reach the next step's weights. Needs the extra ``openai``.
"""

from __future__ import annotations

import importlib.util
from typing import Any, ClassVar

from actorsys._errors import ConfigError
from actorsys.contracts import (
    CheckpointEvalFn,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
    model_files,
)
from actorsys.evals._door.door import FleetDoor
from actorsys.runtime import AsyncioThread
from actorsys.runtime.asyncio_thread import STOP_GRACE

CLIENT_KEY = "actorsys-door"
"""The key the client sends: the door's URL token is its credential, and the door replaces
the key with the fleet's own before forwarding."""


class OpenAIEvalFn(CheckpointEvalFn):
    """A :class:`~actorsys.CheckpointEvalFn` whose evaluation is ``evaluate_with_client``.

    ``evaluate_with_client(client, model, input)`` is an ``async def`` that runs on a private
    asyncio event loop in its own thread (one per evaluation; the host's asyncio is never
    touched), with ``model`` the name the fleet serves and ``input`` the point's
    :class:`~actorsys.RolloutFnEvalInput`. It returns a
    :class:`~actorsys.RolloutFnEvalOutput` (or raises :class:`~actorsys.EvalSkip`).

    Cancellation: when the evaluation is cut, its asyncio task is cancelled and the door is
    closed at once, without waiting for the task: a coroutine that ignores the cancellation
    runs on in its thread, but whatever it sends finds the door closed.
    ``statistics()["loops"]`` counts the loops of cut evaluations still running.

    When the evaluation ends or is cut, its loop is shut down in its own thread, without
    holding up the point: the task is cancelled and has ``shutdown_grace`` seconds to run its
    clean-up (the client closes its connections); one that ignores the cancellation longer is
    closed where it waits, and the loop closed after it, so nothing is left to run on a closed
    loop when the task is collected.

    ``request_timeout`` (seconds per request) and ``max_retries`` are the client's; override
    them, and ``shutdown_grace``, as class attributes.
    """

    request_timeout: ClassVar[float] = 600.0
    max_retries: ClassVar[int] = 2
    shutdown_grace: ClassVar[float] = STOP_GRACE

    async def evaluate_with_client(
        self, client: Any, model: str, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        raise NotImplementedError(f"{type(self).__name__} does not implement evaluate_with_client")

    def statistics(self) -> dict[str, int]:
        return {"loops": sum(loop.running for loop in self._loops())}

    async def evaluate_checkpoint(
        self, checkpoint_dir: str | None, input: RolloutFnEvalInput  # noqa: A002
    ) -> Any:
        if importlib.util.find_spec("openai") is None:
            raise ConfigError(type(self).__name__, "needs the OpenAI SDK: pip install 'actorsys[openai]'")
        door = FleetDoor(input.fleet, model_files(checkpoint_dir, input), who=type(self).__name__)

        async def work(url: str, model: str) -> Any:
            loop = AsyncioThread(name=f"actorsys-openai-step-{input.rollout_id}")
            loops = self._loops()
            loops[:] = [old for old in loops if old.running]
            loops.append(loop)
            try:
                return await loop.run(self._with_client(url, model, input))
            finally:
                loop.stop(timeout=0.0, grace=self.shutdown_grace)  # never waits here

        return await door.run(work)

    async def _with_client(self, url: str, model: str, input: RolloutFnEvalInput) -> Any:  # noqa: A002
        """On the private loop: a client to the door for the evaluation, closed after it."""
        import openai

        async with openai.AsyncOpenAI(
            base_url=f"{url}/v1",
            api_key=CLIENT_KEY,
            timeout=self.request_timeout,
            max_retries=self.max_retries,
        ) as client:
            return await self.evaluate_with_client(client, model, input)

    def _loops(self) -> list[AsyncioThread]:
        """The loops of this eval fn's evaluations (kept on the instance without relying on
        ``__init__``, which subclasses define freely)."""
        loops: list[AsyncioThread] = self.__dict__.setdefault("_actorsys_loops", [])
        return loops

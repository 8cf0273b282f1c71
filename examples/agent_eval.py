"""A multi-turn, tool-using evaluation: an agent loop written with the OpenAI SDK, a local
calculator tool, and a score per conversation.

The model is asked arithmetic questions with a ``calculator`` tool; whenever it calls the tool
the loop computes the result locally and sends it back, until the model answers in text (or
``max_turns`` runs out). A conversation scores 1 when the last number of the final answer is
the right result. Use it as the eval fn of any pipeline whose fleet serves a chat model::

    eval_fn = CalculatorAgent()
    async with EvalSupervisor.open(config, eval_fn=eval_fn, fleet=fleet) as sup: ...
    # metrics: eval/calculator/solved, eval/calculator/tool_calls
"""

from __future__ import annotations

import ast
import asyncio
import json
import operator
import re
from collections.abc import Sequence
from typing import Any

from actorsys import RolloutFnEvalInput, RolloutFnEvalOutput
from actorsys.evals import OpenAIEvalFn

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression, such as '(3 + 4) * 5'.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
PROBLEMS = [("What is 12 * 7?", 84.0), ("What is (3 + 4) * 5 - 6?", 29.0)]
SYSTEM = "Use the calculator for arithmetic, then give the answer as a number."
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
             ast.Div: operator.truediv, ast.USub: operator.neg}
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def calculate(expression: str) -> str:
    """The value of an arithmetic ``expression`` (numbers, + - * /, parentheses), or an error
    the model can read. Never ``eval``: the expression comes from the model."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return float(OPERATORS[type(node.op)](value(node.left), value(node.right)))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return float(OPERATORS[type(node.op)](value(node.operand)))
        raise ValueError(f"unsupported: {ast.dump(node)[:40]}")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as exc:
        return f"error: {exc}"
    return f"{result:g}"


class CalculatorAgent(OpenAIEvalFn):
    """Each problem is one conversation of at most ``max_turns`` model turns; all run at once."""

    def __init__(self, problems: Sequence[tuple[str, float]] = PROBLEMS, *, max_turns: int = 4,
                 max_tokens: int = 128) -> None:
        self.problems = list(problems)
        self.max_turns = max_turns
        self.max_tokens = max_tokens

    async def evaluate_with_client(
        self, client: Any, model: str, input: RolloutFnEvalInput  # noqa: A002
    ) -> RolloutFnEvalOutput:
        conversations = await asyncio.gather(
            *(self.solve(client, model, question, answer) for question, answer in self.problems)
        )
        count = len(conversations)
        return RolloutFnEvalOutput(
            data={"conversations": conversations},
            metrics={
                "eval/calculator/solved": sum(c["solved"] for c in conversations) / count,
                "eval/calculator/tool_calls": sum(c["tool_calls"] for c in conversations) / count,
            },
        )

    async def solve(self, client: Any, model: str, question: str, answer: float) -> dict[str, Any]:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": question},
        ]
        tool_calls = 0
        for _ in range(self.max_turns):
            reply = await client.chat.completions.create(
                model=model, messages=messages, tools=[CALCULATOR], temperature=0,
                max_tokens=self.max_tokens,
            )
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                tool_calls += 1
                try:
                    expression = str(json.loads(call.function.arguments).get("expression", ""))
                except (ValueError, AttributeError):
                    expression = ""
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": calculate(expression)}
                )
        last = messages[-1]
        final = (last.get("content") or "") if last["role"] == "assistant" else ""
        numbers = NUMBER.findall(final)
        solved = bool(numbers) and float(numbers[-1]) == answer
        return {"question": question, "messages": messages, "tool_calls": tool_calls,
                "solved": solved}

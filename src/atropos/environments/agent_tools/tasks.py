"""The tasks of `agent_tools`: questions over the shipped planet catalogue, and its two tools.

The catalogue (`data/agent_tools/planets.json`) is made up, so the policy cannot know it: each
question needs two `lookup` calls and a `calculator` call, e.g. "How many moons does Zorb have
plus the rings of Quell?". Items are drawn from the catalogue with a seed (train and test
disjoint by planet pair).

>>> task = make_tasks("test", 1)[0]
>>> sorted(task)
['answer', 'question']
>>> calculator("6 * (7 - 2)"), lookup("Zorb")["moons"] >= 0
('30', True)
"""

from __future__ import annotations

import functools
import itertools
import json
import random
import re
from typing import Any

from atropos.environments.common.data_loading import data_path
from atropos.environments.common.expressions import ExpressionError, exact_value

ATTRIBUTES = ("moons", "rings", "volcanoes")
OPERATIONS = {"plus": "+", "times": "*", "minus": "-"}


@functools.cache
def catalogue() -> dict[str, dict[str, int]]:
    """The planets and their numbers."""
    with open(data_path("agent_tools", "planets.json"), encoding="utf-8") as f:
        return dict(json.load(f))


def lookup(name: str) -> dict[str, Any]:
    """The tool `lookup(name)`: a planet's entry, or an error naming the known planets."""
    found = catalogue().get(name.strip().title())
    if found is None:
        return {"error": f"no planet {name!r}; known: {', '.join(sorted(catalogue()))}"}
    return {"planet": name.strip().title(), **found}


def calculator(expression: str) -> str:
    """The tool `calculator(expression)`: integer +, -, * and parentheses, nothing else
    (`common.expressions.exact_value`); the value as digits, or `error: ...`."""
    try:
        return str(exact_value(expression, operators="+-*", decimals=False))
    except ExpressionError as err:
        return f"error: {err}"


def make_tasks(split: str, count: int, seed: int = 0) -> list[dict[str, Any]]:
    """`count` questions of `split` ("train" or "test": disjoint planet pairs)."""
    planets = sorted(catalogue())
    pairs = [p for i, p in enumerate(itertools.permutations(planets, 2)) if (i % 5 == 0) == (
        split == "test")]  # fmt: skip
    rng = random.Random(f"{split}:{seed}")
    tasks = []
    for _ in range(count):
        a, b = rng.choice(pairs)
        x, y = rng.choice(ATTRIBUTES), rng.choice(ATTRIBUTES)
        word = rng.choice(list(OPERATIONS))
        left, right = catalogue()[a][x], catalogue()[b][y]
        answer = calculator(f"{left} {OPERATIONS[word]} {right}")
        question = f"What is the number of {x} of {a} {word} the number of {y} of {b}?"
        tasks.append({"question": question, "answer": answer})
    return tasks


_QUESTION = re.compile(r"What is the number of (\w+) of (\w+) (plus|times|minus) the number of"
                       r" (\w+) of (\w+)\?")  # fmt: skip
_TOOL_TURN = "<|im_start|>tool"
_answers = itertools.count()


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder that plays the agent's policy for offline demos and
    tests: looks both planets up, calls the calculator, then answers (right on every other
    answer, one too many on the others: mixed groups); None for other prompts."""
    found = _QUESTION.findall(prompt_text)
    if not found:
        return None
    x, a, word, y, b = found[-1]
    done = prompt_text.count(_TOOL_TURN)
    if done == 0:
        return _call("lookup", {"name": a})
    if done == 1:
        return _call("lookup", {"name": b})
    left, right = catalogue()[a][x], catalogue()[b][y]
    if done == 2:
        return _call("calculator", {"expression": f"{left} {OPERATIONS[word]} {right}"})
    answer = int(calculator(f"{left} {OPERATIONS[word]} {right}"))
    return f"The answer is {answer + next(_answers) % 2}."


def _call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"

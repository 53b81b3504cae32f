"""A tiny dataset environment on the small `Env` class: add two numbers."""

from __future__ import annotations

import re
from typing import Any

from atropos.envs.simple import Env


class Addition(Env):
    name = "addition"
    system_prompt = "Answer with the number only."

    def load(self) -> list[dict[str, Any]]:
        return [
            {"question": f"What is {a} + {b}?", "answer": a + b} for a in range(5) for b in range(5)
        ]

    def load_eval(self) -> list[dict[str, Any]]:
        return [{"question": "What is 2 + 2?", "answer": 4}]

    def score(self, item: dict[str, Any], completion: str) -> float:
        found = re.findall(r"-?\d+", completion)
        return 1.0 if found and int(found[-1]) == item["answer"] else -1.0


def solver(prompt: str) -> str:
    """A responder that gets sums right about half the time, so groups have mixed scores."""
    a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)", prompt)[-1])
    return str(a + b) if (a * 7 + b * 3 + len(prompt)) % 2 else str(a + b + 1)

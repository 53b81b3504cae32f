"""The env-throughput benchmark's task, shared by both env definitions (no atropos imports, so
upstream's venv can load it too): the dataset, the prompt, the score and the item order."""

from __future__ import annotations

import os
import random
from typing import Any

SYSTEM_PROMPT = "Answer with one word."
ITEMS = 1000
MAX_TOKENS = int(os.environ.get("BENCH_MAX_TOKENS", "8"))
"""Completion limit of every request; `benchmarks/env_throughput.py` sets it for both envs."""
SEED = 0


def questions() -> list[dict[str, Any]]:
    """The dataset: `ITEMS` short questions."""
    return [{"question": f"Question {i}: what comes after {i * 7 % 97}?"} for i in range(ITEMS)]


def messages(item: dict[str, Any]) -> list[dict[str, str]]:
    """The chat to complete: the system prompt, then the question as a user turn."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": str(item["question"])},
    ]


def trivial_score(completion: str) -> float:
    """+1 for an even-length completion, -1 for an odd one: costs nothing, varies in a group."""
    return 1.0 if len(completion) % 2 == 0 else -1.0


class Order:
    """Items in shuffled passes, as `atropos.envs.simple.Env` hands them out (same seed)."""

    def __init__(self, items: list[dict[str, Any]], seed: int = SEED) -> None:
        self.items = items
        self._rng = random.Random(seed)
        self._order: list[int] = []

    def next(self) -> dict[str, Any]:
        if not self._order:
            self._order = list(range(len(self.items)))
            self._rng.shuffle(self._order)
        return self.items[self._order.pop()]

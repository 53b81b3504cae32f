"""A single-turn ORS environment written with openreward's own `Environment` and `Server`: a
sum to work out, answered through its `answer` tool (reward 1.0 right, 0.0 wrong, finished).

Run in the interop venv: `python single_turn.py PORT` (serves on 127.0.0.1 until killed).
"""

from __future__ import annotations

import sys

from openreward.environments import Environment, Server, TextBlock, ToolOutput, tool
from pydantic import BaseModel

TASKS = {
    "train": [{"a": 2, "b": 3}, {"a": 10, "b": 7}, {"a": 4, "b": 4}],
    "test": [{"a": 1, "b": 1}, {"a": 6, "b": 5}],
}


class Answer(BaseModel):
    answer: str


class Sums(Environment):
    """What is a + b? One answer per episode."""

    @classmethod
    def list_splits(cls):
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str):
        return TASKS[split]

    def get_prompt(self):
        a, b = self.task_spec["a"], self.task_spec["b"]
        return [TextBlock(text=f"What is {a} + {b}? Call the answer tool with the number.")]

    @tool
    def answer(self, params: Answer) -> ToolOutput:
        """Give the final answer."""
        right = params.answer.strip() == str(self.task_spec["a"] + self.task_spec["b"])
        text = "correct" if right else "wrong"
        return ToolOutput(
            blocks=[TextBlock(text=text)], reward=1.0 if right else 0.0, finished=True
        )


if __name__ == "__main__":
    Server([Sums]).run(host="127.0.0.1", port=int(sys.argv[1]))

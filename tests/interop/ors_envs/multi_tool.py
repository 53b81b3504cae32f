"""A multi-tool ORS environment written with openreward's own `Environment` and `Server`: reach
a target by `add` calls (each an inline reward of 0.1, never finished), then `submit` the total
(1.0 when it is the target, else 0.0; finished). A `fail` tool raises, as a broken
environment's tool would.

Run in the interop venv: `python multi_tool.py PORT` (serves on 127.0.0.1 until killed).
"""

from __future__ import annotations

import sys

from openreward.environments import Environment, Server, TextBlock, ToolOutput, tool
from pydantic import BaseModel

TASKS = {"train": [{"target": 5}, {"target": 3}], "test": [{"target": 2}]}


class Add(BaseModel):
    value: int


class Submit(BaseModel):
    total: int


class Counter(Environment):
    """Count up to a target with `add`, then `submit` the total."""

    def __init__(self, task_spec=None, secrets=None):
        super().__init__(task_spec or {}, secrets or {})
        self.total = 0

    @classmethod
    def list_splits(cls):
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str):
        return TASKS[split]

    def get_prompt(self):
        target = self.task_spec["target"]
        return [TextBlock(text=f"Reach {target}: call add, then submit the total.")]

    @tool
    def add(self, params: Add) -> ToolOutput:
        """Add a value to the running total."""
        self.total += params.value
        return ToolOutput(blocks=[TextBlock(text=f"total={self.total}")], reward=0.1)

    @tool
    def submit(self, params: Submit) -> ToolOutput:
        """Submit the total; ends the episode."""
        right = params.total == self.total == self.task_spec["target"]
        return ToolOutput(
            blocks=[TextBlock(text="done")], reward=1.0 if right else 0.0, finished=True
        )

    @tool
    def fail(self) -> ToolOutput:
        """A tool that breaks."""
        raise RuntimeError("the tool broke")


if __name__ == "__main__":
    Server([Counter]).run(host="127.0.0.1", port=int(sys.argv[1]))

"""An offline stand-in policy for `mcp_tools`: `demo_responder`.

`python -m atropos.testing.fake_server --port 9001 --responder
atropos.environments.mcp_tools:demo_responder`, then `atropos env process mcp_tools`: the
episodes of a shipped task make its expected calls one reply at a time, then answer; one reply
in four misbehaves instead (a wrong answer, a call to a tool that does not exist, an
unreadable call), so groups come out mixed.

>>> task = next(t for t in _tasks() if t.id == "bag-restock-weekday")
>>> reply_for(task, 0, "good")
'<tool_call>{"name": "lookup_item", "arguments": {"query": "Sleeping Bag"}}</tool_call>'
>>> reply_for(task, 2, "good"), reply_for(task, 2, "wrong_answer")
('<answer>Thursday</answer>', '<answer>I do not know</answer>')
"""

from __future__ import annotations

import functools
import itertools
import json

from atropos.environments.common.data_loading import in_prompt
from atropos.environments.mcp_tools.tasks import Task, load_tasks

__all__ = ["BAD_MODES", "demo_responder", "reply_for", "step_of"]

BAD_MODES = ("wrong_answer", "unknown_tool", "malformed")
_replies = itertools.count()


@functools.cache
def _tasks() -> tuple[Task, ...]:
    return tuple(t for split in ("train", "test") for t in load_tasks(split))


def reply_for(task: Task, step: int, mode: str) -> str:
    """The reply at `step` (calls made so far): the next expected call, or the answer once
    they are all made (`mode` "good"); else the misbehaviour `mode` names."""
    if mode == "unknown_tool":
        return '<tool_call>{"name": "teleport", "arguments": {}}</tool_call>'
    if mode == "malformed":
        return '<tool_call>{"name": "lookup_item", "arguments": </tool_call>'
    if step < len(task.expected_calls) and mode == "good":
        return f"<tool_call>{json.dumps(task.expected_calls[step])}</tool_call>"
    answer = task.answer if mode == "good" else "I do not know"
    return f"<answer>{answer}</answer>"


def step_of(task: Task, prompt_text: str) -> int:
    """How many calls the conversation in `prompt_text` has made since the task's request."""
    return prompt_text.rsplit(task.prompt, 1)[-1].count("<tool_call>")


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder: for a shipped task's conversation, a good reply three
    times in four, a misbehaving one the fourth; None (random text) for any other prompt."""
    task = in_prompt({t.prompt: t for t in _tasks()}, prompt_text)
    if task is None:
        return None
    n = next(_replies)
    mode = "good" if n % 4 != 3 else BAD_MODES[(n // 4) % len(BAD_MODES)]
    return reply_for(task, step_of(task, prompt_text), mode)

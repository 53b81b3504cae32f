"""An offline stand-in policy for `mt_grpo`: `demo_responder`, and the replies it writes.

`python -m atropos.testing.fake_server --port 9001 --responder
atropos.environments.mt_grpo:demo_responder`, then `atropos env process mt_grpo` (add
`--env.tools_in_think true` for the other mode): the responder finds the task by its question
and the step by the tool results already in the prompt, and writes the expected call or the
answer, right two times in three and wrong on the third (a misspelt key, an expression off by
one, an answer off by one), so groups come out mixed, turn by turn.
"""

from __future__ import annotations

import functools
import itertools
import json
from typing import Any

from atropos.environments.mt_grpo.episode import THINK_MARK
from atropos.environments.mt_grpo.world import Task, load_tasks

__all__ = ["demo_responder", "reply_for", "wrong_call"]

_calls = itertools.count()
RESULT_MARK = '{"tool": '  # every tool result starts so (json.dumps of World.run's dict)


@functools.cache
def _tasks() -> tuple[Task, ...]:
    return tuple(t for split in ("train", "test") for t in load_tasks(split))


def wrong_call(call: dict[str, Any]) -> dict[str, Any]:
    """`call` gone wrong: a lookup of a misspelt key, or a calculation off by one."""
    args = dict(call["arguments"])
    if call["name"] == "calculator":
        args["expression"] = f"{args['expression']} + 1"
    else:
        args["key"] = f"{args['key']}x"
    return {"name": call["name"], "arguments": args}


def reply_for(task: Task, step: int, right: bool, in_think: bool, continuing: bool) -> str:
    """The reply to step `step` of `task`: call `step` while calls remain, then the answer
    (right, or wrong as `wrong_call` and an answer off by one). In thinking mode the calls sit
    inside the think block; `continuing`: the reply is resumed after a tool result, so it does
    not open the block again."""
    opening = "" if continuing else "<think>\n"
    if step < len(task.calls):
        call = task.calls[step] if right else wrong_call(task.calls[step])
        block = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        if in_think:
            return f"{opening}Step {step + 1}: I need {call['name']}.\n{block}"
        return f"{opening}Step {step + 1}: I need {call['name']}.\n</think>\n{block}"
    answer = task.answer if right else f"{task.answer}1"
    return f"{opening}I have what I need.\n</think>\nThe answer is \\boxed{{{answer}}}."


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder (see the module docstring); None (random text) for
    prompts of no shipped task."""
    found = [t for t in _tasks() if t.question in prompt_text]
    if not found:
        return None
    task = max(found, key=lambda t: len(t.question))
    step = prompt_text.count(RESULT_MARK)
    continuing = prompt_text.rstrip().endswith("</tool_response>")
    right = next(_calls) % 3 != 2
    return reply_for(task, step, right, THINK_MARK in prompt_text, continuing)

"""The rules of `mt_grpo` as plain functions: a turn's reward, the answer, the outcome.

Turn k of an episode (a reply, or in `tools_in_think` mode the stretch of the reply up to one
tool call) is judged against step k of the task: while k < K (the task's K expected calls) it
should make call k, after that it should answer.

- A call step: 0.25 when the turn holds exactly one readable `<tool_call>` (after its last
  `</think>`, as `tool_calls.parse_text` reads them), +0.25 when it calls
  the expected tool, +0.5 when its arguments ask the same (`World.same_arguments`); 0.0 for no
  call, several calls or an unreadable one.
- The answer step and any later one: 1.0 for answering (no call), 0.0 for yet another call.

The outcome is 1.0 when the answer, the last `\\boxed{...}` after the last `</think>` (or in
the whole reply when it has none and no think block is required), says the task's answer
(`world.same_answer`), else 0.0.

>>> from atropos.environments.mt_grpo.world import load_world
>>> world = load_world()
>>> expected = {"name": "lookup", "arguments": {"table": "capital", "key": "Avaria"}}
>>> turn_reward('<tool_call>{"name": "lookup", "arguments": {"table": "capital", "key": "avaria"}}'
...     '</tool_call>', expected, world)
1.0
>>> turn_reward('<tool_call>{"name": "lookup", "arguments": {"table": "population"}}</tool_call>',
...     expected, world)
0.5
>>> turn_reward("<think>done</think>\\\\boxed{7}", None, world)
1.0
>>> answer_of("<think>x</think>\\\\boxed{7}"), answer_of("\\\\boxed{7}", think_required=True)
('7', None)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from atropos.environments.common.completions import boxed_contents
from atropos.environments.common.tool_calls import parse_text
from atropos.environments.mt_grpo.world import World, same_answer

__all__ = [
    "ARGUMENTS_CREDIT",
    "PARSE_CREDIT",
    "TOOL_CREDIT",
    "answer_of",
    "outcome_reward",
    "turn_reward",
]

PARSE_CREDIT = 0.25
TOOL_CREDIT = 0.25
ARGUMENTS_CREDIT = 0.5
_THINK_END = "</think>"


def turn_reward(text: str, expected: Mapping[str, Any] | None, world: World) -> float:
    """The reward of one turn whose text is `text`, against the `expected` call (None: the
    answer is due). See the module docstring."""
    parsed = parse_text(text)
    if expected is None:
        return 0.0 if parsed.calls or parsed.malformed else 1.0
    if len(parsed.calls) != 1 or parsed.malformed:
        return 0.0
    call, reward = parsed.calls[0], PARSE_CREDIT
    if call["name"] != expected["name"]:
        return reward
    reward += TOOL_CREDIT
    if world.same_arguments(call["name"], expected["arguments"], call["arguments"]):
        reward += ARGUMENTS_CREDIT
    return reward


def answer_of(text: str, think_required: bool = False) -> str | None:
    """The answer a reply gives: its last `\\boxed{...}` after the last `</think>` (anywhere
    when there is no `</think>`, unless `think_required`); None when there is none."""
    if _THINK_END in text:
        text = text.rsplit(_THINK_END, 1)[1]
    elif think_required:
        return None
    boxes = boxed_contents(text)
    return boxes[-1] if boxes else None


def outcome_reward(answer: str | None, expected: str) -> float:
    """1.0 when `answer` says `expected` (`world.same_answer`), else 0.0."""
    return 1.0 if answer is not None and same_answer(answer, expected) else 0.0

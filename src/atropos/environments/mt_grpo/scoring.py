"""The rules of `mt_grpo` as plain functions: each turn's reward, the answer, the outcome.

A turn (a reply, or in `tools_in_think` mode the stretch of the reply up to one tool call) is
judged against what the task still needs:

- While some expected call has not been made, a call is due. The turn scores 0.25 when it holds
  exactly one readable `<tool_call>` (after its last `</think>`, as `tool_calls.parse_text`
  reads them), +0.25 when it calls the tool of a call still to make, +0.5 when it also asks what
  that call asks (`World.same_arguments`): the best of the calls still to make, in any order. A
  call made exactly right is done; one made wrong stays to be made (a retry can still score).
  No call, several calls or an unreadable one score 0.
- Once every call is made, the answer is due: 1.0 for answering (no call), 0 for another call.

The outcome is 1.0 when the answer, the last `\\boxed{...}` after the last `</think>` (or in
the whole reply when it has none and no think block is required), says the task's answer
(`world.same_answer`), else 0.0.

>>> import json
>>> from atropos.environments.mt_grpo.world import load_world
>>> def lookup(table, key):
...     return {"name": "lookup", "arguments": {"table": table, "key": key}}
>>> def turn(call):
...     return f"<tool_call>{json.dumps(call)}</tool_call>"
>>> capital, population = lookup("capital", "Avaria"), lookup("population", "Brelholm")
>>> turns = [lookup("capital", "Ithren"), capital, population]  # a wrong call, then a retry
>>> texts = [turn(c) for c in turns] + ["The answer is \\\\boxed{482000}."]
>>> [j.reward for j in judge_turns(texts, [capital, population], load_world())]
[0.5, 1.0, 1.0, 1.0]
>>> answer_of("<think>x</think>\\\\boxed{7}"), answer_of("\\\\boxed{7}", think_required=True)
('7', None)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from atropos.environments.common.completions import boxed_contents
from atropos.environments.common.tool_calls import parse_text
from atropos.environments.mt_grpo.world import World, same_answer

__all__ = [
    "ARGUMENTS_CREDIT",
    "PARSE_CREDIT",
    "TOOL_CREDIT",
    "Judged",
    "answer_of",
    "call_credit",
    "judge_turns",
    "outcome_reward",
]

PARSE_CREDIT = 0.25
TOOL_CREDIT = 0.25
ARGUMENTS_CREDIT = 0.5
_THINK_END = "</think>"


class Judged(NamedTuple):
    """One turn's reward, and whether a call was due at it (False: the answer was)."""

    reward: float
    call_due: bool


def call_credit(call: Mapping[str, Any], expected: Mapping[str, Any], world: World) -> float:
    """A readable call against one expected call: 0.25, +0.25 for its tool, +0.5 for asking
    the same thing."""
    credit = PARSE_CREDIT
    if call["name"] == expected["name"]:
        credit += TOOL_CREDIT
        if world.same_arguments(call["name"], expected["arguments"], call["arguments"]):
            credit += ARGUMENTS_CREDIT
    return credit


def judge_turns(
    texts: Sequence[str], expected: Sequence[Mapping[str, Any]], world: World
) -> list[Judged]:
    """Each turn's reward, the turns' texts in order against the task's `expected` calls (see
    the module docstring)."""
    left, out = list(expected), []
    for text in texts:
        parsed = parse_text(text)
        calls = len(parsed.calls) + parsed.malformed
        if not left:
            out.append(Judged(0.0 if calls else 1.0, False))
            continue
        if calls != 1 or parsed.malformed:
            out.append(Judged(0.0, True))
            continue
        credits = [call_credit(parsed.calls[0], e, world) for e in left]
        best = max(credits)
        if best == 1.0:
            left.pop(credits.index(best))
        out.append(Judged(best, True))
    return out


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

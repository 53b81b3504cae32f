"""Reading a completion's answer: the part after its think block, and what `\\boxed{}` holds;
with the system turn that asks for the think block. Shared by the format environments
(`answer_format`, `json_schema`, `infinimath`, `swe_patch`).

With `--env.thinking_mode` on, a completion must hold exactly one well-ordered
`<think>...</think>` block and only what follows it is read (`rewards.text.split_think`);
without it the whole completion is.

>>> answer_part("<think>6 * 7</think> \\\\boxed{42}", thinking=True)
'\\\\boxed{42}'
>>> answer_part("\\\\boxed{42}", thinking=True) is None, answer_part("42 ", thinking=False)
(True, '42')
>>> boxed_contents("\\\\boxed{\\\\frac{1}{2}} or \\\\boxed{3} or \\\\boxed{unclosed")
['\\\\frac{1}{2}', '3']
"""

from __future__ import annotations

import re

from atropos.envs.types import Message
from atropos.rewards.text import split_think

__all__ = ["THINKING_PROMPT", "answer_part", "boxed_contents", "system_turn"]

THINKING_PROMPT = (
    "You are a careful thinker. Reason for as long as you need inside <think> </think> tags,"
    " then give your final answer after the closing </think> tag."
)
_BOX = re.compile(r"\\boxed\s*\{")


def system_turn(thinking: bool, custom_thinking: str | None = None) -> list[Message]:
    """The system message asking for a think block (`custom_thinking` replaces the default
    prompt), or none when `thinking` is off."""
    if not thinking:
        return []
    return [{"role": "system", "content": custom_thinking or THINKING_PROMPT}]


def answer_part(completion: str, thinking: bool) -> str | None:
    """The stripped text that holds the answer: after the one think block when `thinking`
    (None when that block is missing, repeated or out of order), else the whole completion."""
    body = split_think(completion) if thinking else completion
    return None if body is None else body.strip()


def boxed_contents(text: str) -> list[str]:
    """The stripped contents of every `\\boxed{...}` in `text`, in order, braces matched (a box
    never closed is left out)."""
    found = []
    for match in _BOX.finditer(text):
        depth = 1
        for end in range(match.end(), len(text)):
            depth += 1 if text[end] == "{" else -1 if text[end] == "}" else 0
            if not depth:
                found.append(text[match.end() : end].strip())
                break
    return found

"""Reading a completion's answer: the part after its think block, and what `\\boxed{}` holds;
with the conversation that asks for the think block. Shared by the format environments
(`answer_format`, `json_schema`, `infinimath`, `swe_patch`), whose defaults are
`THINKING_DEFAULTS`.

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
from typing import Any

from atropos.envs.config import BaseEnvConfig
from atropos.envs.types import Message
from atropos.rewards.text import split_think

__all__ = ["THINKING_DEFAULTS", "THINKING_PROMPT", "answer_part", "boxed_contents", "conversation"]

THINKING_PROMPT = (
    "You are a careful thinker. Reason for as long as you need inside <think> </think> tags,"
    " then give your final answer after the closing </think> tag."
)
THINKING_DEFAULTS: dict[str, Any] = {"group_size": 8, "use_wandb": False, "thinking_mode": True}
_BOX = re.compile(r"\\boxed\s*\{")


def conversation(config: BaseEnvConfig, question: str) -> list[Message]:
    """`question` as the user turn, after a system turn asking for a think block when
    `thinking_mode` is on (`custom_thinking_prompt` replaces the default prompt)."""
    user: Message = {"role": "user", "content": question}
    if not config.thinking_mode:
        return [user]
    return [{"role": "system", "content": config.custom_thinking_prompt or THINKING_PROMPT}, user]


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

"""Answer extraction for `reasoning_gym`: what a completion hands the task's scorer.

reasoning-gym's own convention is the last `<answer>...</answer>` block, stripped; a completion
that has none but closes a thinking block answers with the text after the last `</think>`. A
completion with neither gives no answer (None), which every task scores 0.

>>> extract_answer("<think>2 + 2</think><answer> 4 </answer>")
'4'
>>> extract_answer("<answer>3</answer> or rather <answer>4</answer>")
'4'
>>> extract_answer("<think>two plus two</think>\\n4\\n")
'4'
>>> extract_answer("just 4") is None
True
"""

from __future__ import annotations

import re

__all__ = ["extract_answer"]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK_END = "</think>"


def extract_answer(completion: str) -> str | None:
    """The answer in `completion`: the last `<answer>` block, else the text after the last
    `</think>`, stripped; None when it has neither (or the text after `</think>` is empty)."""
    blocks = _ANSWER.findall(completion)
    if blocks:
        return str(blocks[-1]).strip()
    head, found, tail = completion.rpartition(_THINK_END)
    if not found:
        return None
    return tail.strip() or None

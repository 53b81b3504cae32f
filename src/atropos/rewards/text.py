"""Parsing completions the way upstream's verifier environments did: a strict think block and
tagged answers.

Upstream's letter counting, instruction following, MCQA and fundamentals environments accept a
completion only with exactly one well-ordered `<think>...</think>` pair and nothing think-like
after it; the answer is read from what follows. `split_think` returns that part or None (MCQA
and fundamentals matched the tags in any case: `ignore_case=True`; tool use multi-turn wants
the block to open the reply: `leading=True`).

>>> split_think("<think>2+2</think> The answer is 4.")
' The answer is 4.'
>>> split_think("no thinking") is None, split_think("<think>a</think><think>b</think>") is None
(True, True)
>>> split_think("plain answer", required=False)
'plain answer'
>>> split_think("<THINK>a</Think> 4") is None, split_think("<THINK>a</Think> 4", ignore_case=True)
(True, ' 4')
>>> split_think("So: <think>a</think> 4"), split_think("So: <think>a</think> 4", leading=True)
(' 4', None)
>>> tagged("<answer>3</answer> and <answer>4</answer>", "answer")
['3', '4']
"""

from __future__ import annotations

import re

__all__ = ["normalise_think", "split_think", "tagged"]

_THINK_TAG = re.compile(r"<(/?)think>", re.IGNORECASE)


def normalise_think(text: str) -> str:
    """Think tags in any case (`<THINK>`, `</Think>`) as `<think>` and `</think>`."""
    return _THINK_TAG.sub(r"<\1think>", text)


def split_think(
    text: str, required: bool = True, ignore_case: bool = False, leading: bool = False
) -> str | None:
    """The text after a single `<think>...</think>` block, or None when the block is missing
    (and `required`), repeated, unclosed or out of order. Without a block and not `required`,
    the whole text. With `ignore_case`, tags in any case count (`<THINK>`); with `leading`,
    the block must open the text (white space only before it)."""
    if ignore_case:
        text = normalise_think(text)
    opens, closes = text.count("<think>"), text.count("</think>")
    if opens == 0 and closes == 0:
        return None if required else text
    if opens != 1 or closes != 1:
        return None
    start, end = text.index("<think>"), text.index("</think>")
    if end < start or (leading and text[:start].strip()):
        return None
    return text[end + len("</think>") :]


def tagged(text: str, tag: str) -> list[str]:
    """The contents of every `<tag>...</tag>` in `text`, in order (tags matched exactly)."""
    name = re.escape(tag)
    return re.findall(rf"<{name}>(.*?)</{name}>", text, flags=re.DOTALL)

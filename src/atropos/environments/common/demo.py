"""Offline demo responders, for `FakeInferenceServer(responder=...)` and `python -m
atropos.testing.fake_server --responder module:function`: the shipped row a prompt asks about,
right and wrong answers in turn, and the think block when the prompt asks for one.

>>> turns = Alternating()
>>> [turns.right() for _ in range(3)]
[True, False, True]
>>> with_thinking("Reason inside <think> </think> tags. 2+2?", "I add.", "4")
'<think>I add.</think>\\n4'
>>> with_thinking("2+2?", "I add.", "4")
'4'
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

from atropos.environments.common.data_loading import data_path, read_jsonl

__all__ = ["Alternating", "shipped_rows", "with_thinking"]


@functools.cache
def shipped_rows(fixture: str, key: str) -> dict[str, dict[str, Any]]:
    """The rows of `data/<fixture>/train.jsonl` and `test.jsonl` by their `key` field (with
    `common.data_loading.in_prompt`: the row a prompt is about)."""
    rows = [read_jsonl(data_path(fixture, f"{split}.jsonl")) for split in ("train", "test")]
    return {str(row[key]): row for row in itertools.chain(*rows)}


class Alternating:
    """Right on the first call, wrong on the next, and so on: mixed groups."""

    def __init__(self) -> None:
        self._turns = itertools.count()

    def right(self) -> bool:
        """Whether this call's answer is the right one."""
        return next(self._turns) % 2 == 0


def with_thinking(prompt_text: str, thinking: str, answer: str) -> str:
    """`answer`, after a think block holding `thinking` when the prompt asks for think tags."""
    return f"<think>{thinking}</think>\n{answer}" if "<think>" in prompt_text else answer

"""Reading the answers a completion states to a multiple-choice question, as letters.

Shared by `mcqa` (exactly one stated answer, the gold one) and the multiple-choice evals
(`eval_mmlu`, `eval_gpqa`, through `evals/answers.py`). An answer counts after "The correct
answer is", "The best answer is", "The answer is" or "Thus, final answer" (colon, bold,
parentheses and \\boxed{} allowed), as a bare \\boxed{X}, or as the gold option's exact text
after one of those phrases.
"""

from __future__ import annotations

import functools
import re

__all__ = ["LETTERS", "extract_answers"]

LETTERS = "ABCDEFGHIJ"
_PHRASE = (
    r"(?i:the\s+(?:correct\s+|best\s+)?answer\s+is|thus,?\s+(?:the\s+)?final\s+answer(?:\s+is)?)"
)
_LEAD = r"\s*:?\s*(?:\*\*)?\s*(?:\\boxed\{\s*)?(?i:option\s+)?\(?"


@functools.lru_cache(maxsize=4096)
def _answers_pattern(gold_text: str) -> re.Pattern[str]:
    text = rf"(?i:{re.escape(gold_text)})" if gold_text.strip() else r"(?!)"  # (?!): never
    stated = rf"{_PHRASE}{_LEAD}(?:(?P<gold>{text})|(?P<letter>[{LETTERS}]))(?![A-Za-z0-9])"
    boxed = rf"\\boxed\{{\s*(?P<boxed>[{LETTERS}{LETTERS.lower()}])\s*\}}"
    return re.compile(f"{stated}|{boxed}")


def extract_answers(answer_text: str, gold_letter: str, gold_text: str = "") -> list[str]:
    """Every answer stated in `answer_text`, as letters (the gold option's text counts as the
    gold letter). Letters after a phrase must be capitals standing alone ("The answer is a
    bit..." states nothing); inside \\boxed{} either case counts.

    >>> extract_answers("The answer is (C). Thus, final answer: \\\\boxed{D}", "A")
    ['C', 'D']
    >>> extract_answers("The correct answer is: **Rome**", "C", "Rome")
    ['C']
    """
    found = []
    for match in _answers_pattern(gold_text).finditer(answer_text):
        if match.group("gold"):
            found.append(gold_letter.upper())
        else:
            found.append((match.group("letter") or match.group("boxed")).upper())
    return found

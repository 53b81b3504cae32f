"""Reading and comparing the answers of the multimodal environments.

The answer is read from what follows the last `</think>` (a `<think>` never closed gives no
answer), in the form the env asks for: exactly one `<answer>...</answer>` block (`tags`, as
upstream's OCR-VQA, clocks and pixmo-count environments asked), exactly one `\\boxed{...}`
(`boxed`, as upstream's CLEVR environments asked), or either (`either`: tags when there are
any, else a box). An answer block holding one box is read through it. More than one block is
no answer: a completion cannot hedge.

Answers compare after normalising: numbers numerically (`03`, `3.0` and `three` are 3), words
up to case, runs of white space and the punctuation or quotes around them, with the env's
synonyms (`ball` for `sphere`); times on a 12-hour dial, to within a tolerance in minutes.

>>> read_answer("<think>two or three?</think> <answer>3</answer>", "tags")
'3'
>>> read_answer("So \\\\boxed{yes}.", "boxed"), read_answer("<answer>1</answer><answer>1</answer>")
('yes', None)
>>> same_answer("Three.", "3"), same_answer(' "The  Silent River" ', "the silent river")
(True, True)
>>> dial_minutes("15:05") == dial_minutes("3:05 pm") == 185, minutes_apart(5, 715)
(True, 10)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

from atropos.environments.common.completions import boxed_contents

__all__ = [
    "AnswerStyle",
    "as_number",
    "dial_minutes",
    "final_part",
    "minutes_apart",
    "normal_text",
    "read_answer",
    "same_answer",
]

AnswerStyle = Literal["tags", "boxed", "either"]
NUMBER_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
    " fifteen sixteen seventeen eighteen nineteen twenty"
).split()
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_AROUND = " \t\r\n.,;:!?\"'`*"
_TIME = re.compile(
    r"(\d{1,2})\s*[:h.]\s*(\d{2})(?:\s*:\s*\d{2})?\s*(am|pm|a\.m\.?|p\.m\.?)?", re.IGNORECASE
)
DIAL = 12 * 60  # minutes once round an analogue clock


def final_part(completion: str) -> str | None:
    """What follows the last `</think>` (the whole text without think tags); None when a
    `<think>` is never closed."""
    lower = completion.lower()
    if "</think>" in lower:
        return re.split(r"</think>", completion, flags=re.IGNORECASE)[-1]
    return None if "<think>" in lower else completion


def read_answer(completion: str, style: AnswerStyle = "tags") -> str | None:
    """The one answer of `completion` in `style`, stripped; None when there is none or more
    than one (see the module docstring)."""
    body = final_part(completion)
    if body is None:
        return None
    tags = _ANSWER.findall(body)
    if style == "tags" or (style == "either" and tags):
        if len(tags) != 1:
            return None
        inner = boxed_contents(tags[0])
        return inner[0] if len(inner) == 1 else tags[0].strip()
    boxes = boxed_contents(body)
    return boxes[0] if len(boxes) == 1 else None


def normal_text(text: str) -> str:
    """`text` in lower case with runs of white space as one space, and the punctuation and
    quotes around it taken off."""
    return " ".join(text.split()).casefold().strip(_AROUND)


def as_number(text: str) -> float | None:
    """The number `text` is (digits, or a number word up to twenty), else None."""
    cleaned = normal_text(text)
    if _NUMBER.fullmatch(cleaned):
        return float(cleaned)
    return float(NUMBER_WORDS.index(cleaned)) if cleaned in NUMBER_WORDS else None


def same_answer(answer: str, gold: str, synonyms: Mapping[str, str] | None = None) -> bool:
    """Whether `answer` says `gold`: numerically when the gold is a number, else as normalised
    text, each side first mapped through `synonyms` (normalised word -> canonical word)."""
    number = as_number(gold)
    if number is not None:
        return as_number(answer) == number
    said, meant = normal_text(answer), normal_text(gold)
    if synonyms:
        said, meant = synonyms.get(said, said), synonyms.get(meant, meant)
    return said == meant


def dial_minutes(text: str) -> int | None:
    """A time of day read as minutes past 12 on an analogue dial (`3:05`, `03:05`, `15:05` and
    `3:05 PM` are all 185; `12:00` and `0:00` are 0); None when `text` is not a time."""
    found = _TIME.fullmatch(normal_text(text))
    if found is None:
        return None
    hour, minute = int(found.group(1)), int(found.group(2))
    if hour > 23 or minute > 59:
        return None
    return (hour % 12) * 60 + minute


def minutes_apart(a: int, b: int) -> int:
    """How far apart two dial times are, the short way round (at most 6 hours)."""
    gap = abs(a - b) % DIAL
    return min(gap, DIAL - gap)

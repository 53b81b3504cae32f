r"""Reading and checking the evaluation envs' answers: boxed math answers and option letters.

Math (`grade_boxed`): the answer is the `\boxed{}` in the text after thinking. Several boxes
that say different things are wrong (answer spraying); the same answer boxed twice is fine.
The box is checked by math-verify (`atropos.rewards.math`) against the gold, and when that says
no, by comparing both as normalised strings (`normalize`), upstream's fallback.
The `\text{...}` of a unit inside the box is fine (`\boxed{7 \text{ muffins}}`).

Multiple choice (`grade_choice`): the letters `common.choices.extract_answers` finds
("The best answer is: B", "The answer is (C)", `\boxed{D}`, the right option's text), after
"Answer: X" is read as "The answer is: X" and a reply of only a letter ("B", "(B)", "**B**") as
that letter. One distinct letter is an answer; two different ones are wrong.

>>> grade_boxed(r"so \boxed{1,000}", "1000").correct, grade_boxed(r"\boxed{5} or \boxed{6}", "5")
(True, Graded(extracted='5 | 6', correct=False, details={'boxed': ['5', '6']}))
>>> grade_choice("**Answer:** C", "C", "Paris").extracted, grade_choice("(b)", "B").correct
('C', True)
>>> normalize(r"$\dfrac{1}{2}$"), normalize("1,000.00"), normalize(r"10\%")
('\\frac{1}{2}', '1000', '10')
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from atropos.environments.common.choices import extract_answers
from atropos.environments.evals.base import Graded, boxed_contents
from atropos.rewards.math import equivalent, parse_answer, parse_boxed, parse_gold

__all__ = [
    "CHOICE_INSTRUCTION",
    "LETTERS",
    "check_math",
    "choice_block",
    "grade_boxed",
    "grade_choice",
    "normalize",
]

LETTERS = "ABCDEFGHIJ"
CHOICE_INSTRUCTION = (
    'Answer with "The best answer is: X", where X is the letter of the right option.'
)
_ANSWER_COLON = re.compile(r"(?i)\**\b(?:final\s+)?answer\b\**\s*:\**")
_ONLY_LETTER = re.compile(r"^[\s*(]*([A-Ja-j])[\s*).]*$")
_REMOVE = (
    r"\$",
    r"\left",
    r"\right",
    r"\!",
    r"\,",
    r"\;",
    r"\ ",
    "$",
    r"\%",
    "%",
    "^\\circ",
    "^{\\circ}",
)


def normalize(text: str) -> str:
    """An answer for string comparison: no `$`, spacing commands, `\\left`/`\\right`, percent or
    degree signs, `\\text{}` wrappers or thousands separators; `\\dfrac` as `\\frac`; a whole
    number written with trailing zeros (`72.0`) as the whole number; no trailing period."""
    text = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", text)
    for token in _REMOVE:
        text = text.replace(token, "")
    text = text.replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac")
    text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)
    text = re.sub(r"\s+", "", text).rstrip(".")
    return re.sub(r"^(-?\d+)\.0+$", r"\1", text)


def check_math(answer: str, gold: Any) -> bool:
    """Whether a boxed answer's content equals `gold`: math-verify with upstream gsm8k's
    extraction, then with the lenient one (`\\sqrt5`, `\\frac12`), then the strings."""
    gold_text, boxed = str(gold).strip(), f"\\boxed{{{answer}}}"
    parsed = parse_gold(gold_text)
    if equivalent(parsed, parse_boxed(boxed)) or equivalent(parsed, parse_answer(boxed)):
        return True
    return bool(answer.strip()) and normalize(answer) == normalize(gold_text)


def grade_boxed(answer: str, gold: Any) -> Graded:
    r"""Grade a math answer part by its `\boxed{}`: none is unanswered, differing ones wrong."""
    boxes = boxed_contents(answer)
    distinct = list(dict.fromkeys(normalize(b) for b in boxes))
    if not boxes:
        return Graded(None, False)
    if len(distinct) > 1:
        return Graded(" | ".join(boxes), False, {"boxed": boxes})
    return Graded(boxes[-1], check_math(boxes[-1], gold))


def choice_block(options: Sequence[str], letters: str = LETTERS) -> str:
    """The options as lines "A. text".

    >>> print(choice_block(["red", "blue"]))
    A. red
    B. blue
    """
    return "\n".join(f"{letter}. {text}" for letter, text in zip(letters, options, strict=False))


def grade_choice(answer: str, gold_letter: str, gold_text: str = "") -> Graded:
    """Grade a multiple-choice answer part: exactly one distinct stated letter, the gold one."""
    gold_letter = gold_letter.strip().upper()
    only = _ONLY_LETTER.match(answer)
    if only:
        found = [only.group(1).upper()]
    else:
        found = extract_answers(_ANSWER_COLON.sub("The answer is:", answer), gold_letter, gold_text)
    distinct = list(dict.fromkeys(found))
    if not distinct:
        return Graded(None, False)
    if len(distinct) > 1:
        return Graded(",".join(distinct), False, {"answers": distinct})
    return Graded(distinct[0], distinct[0] == gold_letter)

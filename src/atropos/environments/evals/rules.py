r"""Reading short stated answers: a word from a closed set (yes/no/maybe) and a free answer
after "Answer:" or "So the answer is" (BBH's targets, DROP's spans), each compared by its kind.

A stated answer is the rest of the line after "Answer:", "Final answer:", "The answer is" or
"So the answer is" (markdown bold allowed), or the content of a `\boxed{}`; a reply of a single
line is its own answer. Closed sets are strict, as the option letters are (`answers.py`): two
different stated words are wrong. Free answers take the last one stated.

>>> stated_answers("So the answer is (B).\nAnswer: **C**")
['(B)', 'C']
>>> grade_word("Answer: Yes, it does.", "yes").correct, grade_word("Answer: yes. Answer: no", "yes")
(True, Graded(extracted='yes,no', correct=False, details={'answers': ['yes', 'no']}))
>>> [target_matches("(C)", s) for s in ("C", "(C) blue", "c", "(D)")]
[True, True, False, False]
>>> target_matches("-12", "-12.0"), target_matches("] ) >", "])>")
(True, True)
>>> target_matches("valid", "Invalid"), target_matches("valid", "valid.")
(False, True)
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from atropos.environments.evals.base import Graded, boxed_contents

__all__ = ["grade_target", "grade_word", "last_answer", "stated_answers", "target_matches"]

_LEAD = (
    r"(?:\b(?:final\s+)?answer\s*\**\s*:"
    r"|\bthe\s+(?:final\s+|correct\s+|best\s+)?answer\s+is\b\s*:?)"
)
_PHRASE = re.compile(rf"(?i){_LEAD}\**[ \t]*(?P<rest>[^\n]*?)(?=[ \t]*{_LEAD}|\n|$)")
_EDGES = " \t*\"'`.,;:!"
_MC_TARGET = re.compile(r"\(([A-Z])\)")
_MC_STATED = re.compile(r"\(?([A-Z])\)?(?=$|[\s.,:;)])")
_NUMBER = re.compile(r"-?\d+(?:\.0+)?")


def _clean(text: str) -> str:
    return text.strip().strip(_EDGES).strip()


def stated_answers(text: str) -> list[str]:
    """Every answer stated in `text`, in order: after an answer phrase, or in a `\\boxed{}`;
    a text of one line with neither is itself the answer."""
    found = [(m.start(), _clean(m.group("rest"))) for m in _PHRASE.finditer(text)]
    for box in re.finditer(r"\\boxed\s*\{", text):
        inner = boxed_contents(text[box.start() :])
        if inner:
            found.append((box.start(), _clean(inner[0])))
    stated = [answer for _, answer in sorted(found) if answer]
    if not stated and text.strip() and "\n" not in text.strip():
        stated = [_clean(text)]
    return [answer for answer in stated if answer]


def last_answer(text: str) -> str | None:
    """The last answer `text` states (None: it states none)."""
    stated = stated_answers(text)
    return stated[-1] if stated else None


def grade_word(answer: str, gold: str, words: Sequence[str] = ("yes", "no")) -> Graded:
    """Grade a closed-set answer (yes/no, or yes/no/maybe): the first word of each stated
    answer that is one of `words`; exactly one distinct word, the gold one, is right."""
    first = (re.match(r"[A-Za-z]+", answer) for answer in stated_answers(answer))
    found = [m.group().lower() for m in first if m and m.group().lower() in words]
    distinct = list(dict.fromkeys(found))
    if len(distinct) != 1:
        details = {"answers": distinct} if distinct else {}
        return Graded(",".join(distinct) or None, False, details)
    return Graded(distinct[0], distinct[0] == gold.strip().lower())


def target_matches(target: str, stated: str) -> bool:
    """Whether `stated` is BBH's `target`, compared by the target's kind: an option "(B)" by
    its letter, an integer by value, a single word (True, valid, Yes) by that word in any case,
    a row of brackets with the spaces removed, anything else with runs of spaces as one."""
    target, stated = target.strip(), _clean(stated)
    option = _MC_TARGET.fullmatch(target)
    if option:
        letter = _MC_STATED.match(stated)
        return letter is not None and letter.group(1) == option.group(1)
    if _NUMBER.fullmatch(target):
        number = _NUMBER.fullmatch(stated.replace(",", ""))
        return number is not None and float(number.group()) == float(target)
    if re.fullmatch(r"[A-Za-z]+", target):
        word = re.match(r"[A-Za-z]+", stated)
        return word is not None and word.group().lower() == target.lower()
    if not re.search(r"\w", target):
        return re.sub(r"\s+", "", stated) == re.sub(r"\s+", "", target)
    return " ".join(stated.lower().split()) == " ".join(target.lower().split())


def grade_target(answer: str, target: str) -> Graded:
    """Grade a BBH answer: the last stated answer against the task's target."""
    stated = last_answer(answer)
    if stated is None:
        return Graded(None, False)
    return Graded(stated, target_matches(target, stated))

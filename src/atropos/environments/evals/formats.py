r"""How a suite's rows become problems and how an answer to one is graded: one `Format` per
kind of question, each given the suite's field readers (`catalog.py`).

- `MultipleChoice`: the options as lines "A. text", the right option's letter (`grade_choice`).
- `YesNo`: a closed word set, yes/no or yes/no/maybe (`rules.grade_word`).
- `BoxedMath`: a `\boxed{}` answer checked by math-verify (`grade_boxed`); several gold answers
  (OlympiadBench's multi-answer problems) are one box of comma-separated answers, in any order.
- `BoxedInteger`: a `\boxed{}` integer (AIME).
- `Target`: BBH's free answer against the task's target (`rules.grade_target`).
- `Spans`: DROP's answer spans, exact match and F1 (`spans.py`).

>>> fmt = YesNo(question=lambda r: r["q"], answer=lambda r: r["a"])
>>> p = fmt.problem({"q": "Is ice cold?", "a": "Yes"}, "x-0")
>>> p.gold, fmt.grade(p, "Answer: yes").correct, p.prompt.splitlines()[-1]
('yes', True, 'Answer with "Answer: yes" or "Answer: no".')
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from atropos.environments.evals.answers import (
    CHOICE_INSTRUCTION,
    LETTERS,
    check_math,
    choice_block,
    grade_boxed,
    grade_choice,
    normalize,
)
from atropos.environments.evals.base import Graded, Problem, boxed_contents
from atropos.environments.evals.rules import grade_target, grade_word, last_answer
from atropos.environments.evals.spans import best_scores

__all__ = [
    "BoxedInteger",
    "BoxedMath",
    "Format",
    "MultipleChoice",
    "Row",
    "Spans",
    "Target",
    "YesNo",
    "integer_of",
    "mean_detail",
]

Row = Mapping[str, Any]
TARGET_INSTRUCTION = (
    'Think it through, then finish with "So the answer is X.", where X is the answer in the form'
    " the question asks for (an option as its letter in parentheses, e.g. (B))."
)
SPANS_INSTRUCTION = (
    'Answer from the passage. Finish with "Answer: X", where X is a number, a date or words from'
    " the passage; separate several answers with semicolons."
)


class Format:
    """Turns a row into a `Problem` and grades an answer to it (think block removed)."""

    requires: ClassVar[dict[str, str]] = {}  # modules its grading needs -> the extra with them

    def problem(self, row: Row, ident: str) -> Problem:
        """The row as a problem with id `ident` (subsets are the suite's to add)."""
        raise NotImplementedError

    def grade(self, problem: Problem, answer: str) -> Graded:
        """Grade one completion's answer part."""
        raise NotImplementedError

    def extra_metrics(self, problems: list[Problem], graded: list[list[Graded]]) -> dict[str, Any]:
        """The benchmark's own numbers beyond accuracy and pass@k (default: none)."""
        return {}


def mean_detail(graded: list[list[Graded]], key: str) -> float:
    """The mean of detail `key` over all samples (a sample without it counts 0)."""
    values = [float(g.details.get(key, 0.0)) for row in graded for g in row]
    return sum(values) / len(values) if values else 0.0


@dataclass(frozen=True)
class MultipleChoice(Format):
    """Options lettered A, B, ...; the right letter (or the right option's text) is right."""

    question: Callable[[Row], str]
    options: Callable[[Row], Sequence[str]]
    answer: Callable[[Row], int]  # the right option's index

    def problem(self, row: Row, ident: str) -> Problem:
        options = [str(option).strip() for option in self.options(row)]
        right = self.answer(row)
        if not 0 <= right < min(len(options), len(LETTERS)):
            raise ValueError(f"{ident}: answer {right} does not index its {len(options)} options")
        text = f"{self.question(row).strip()}\n\n{choice_block(options)}\n\n{CHOICE_INSTRUCTION}"
        return Problem(ident, text, LETTERS[right], data={"gold_text": options[right]})

    def grade(self, problem: Problem, answer: str) -> Graded:
        return grade_choice(answer, problem.gold, problem.data["gold_text"])


@dataclass(frozen=True)
class YesNo(Format):
    """A question answered with one word of `words` ("Answer: yes")."""

    question: Callable[[Row], str]
    answer: Callable[[Row], str]
    words: tuple[str, ...] = ("yes", "no")

    def problem(self, row: Row, ident: str) -> Problem:
        gold = str(self.answer(row)).strip().lower()
        if gold not in self.words:
            raise ValueError(f"{ident}: answer {gold!r} is not one of {', '.join(self.words)}")
        quoted = [f'"Answer: {word}"' for word in self.words]
        choices = ", ".join(quoted[:-1]) + f"{',' if len(quoted) > 2 else ''} or {quoted[-1]}"
        return Problem(ident, f"{self.question(row).strip()}\n\nAnswer with {choices}.", gold)

    def grade(self, problem: Problem, answer: str) -> Graded:
        return grade_word(answer, problem.gold, self.words)


@dataclass(frozen=True)
class BoxedMath(Format):
    """A `\\boxed{}` answer equal to the gold one (or, for several golds, to all of them)."""

    requires: ClassVar[dict[str, str]] = {"math_verify": "envs"}

    question: Callable[[Row], str]
    answer: Callable[[Row], str | list[str]]

    def problem(self, row: Row, ident: str) -> Problem:
        gold = self.answer(row)
        gold = gold[0] if isinstance(gold, list) and len(gold) == 1 else gold
        return Problem(ident, self.question(row), gold)

    def grade(self, problem: Problem, answer: str) -> Graded:
        if not isinstance(problem.gold, list):
            return grade_boxed(answer, problem.gold)
        graded = grade_boxed(answer, ",".join(problem.gold))  # one box, several answers
        if graded.extracted is None or graded.details:
            return graded
        parts = [p.strip() for p in graded.extracted.split(",")]
        unmatched = list(problem.gold)
        for part in parts:
            hit = next((g for g in unmatched if check_math(part, g)), None)
            if hit is not None:
                unmatched.remove(hit)
        return Graded(graded.extracted, len(parts) == len(problem.gold) and not unmatched)


def integer_of(text: str) -> int | None:
    """An answer as an integer, when it is written as one (`042`, `42.0`, `$42$`).

    >>> integer_of("042"), integer_of("42.00"), integer_of("4.5"), integer_of("x")
    (42, 42, None, None)
    """
    found = re.fullmatch(r"-?\d+", normalize(text))
    return int(found.group()) if found else None


@dataclass(frozen=True)
class BoxedInteger(Format):
    """A `\\boxed{}` integer equal to the gold one (else equal by math-verify: `\\frac{84}{2}`)."""

    requires: ClassVar[dict[str, str]] = {"math_verify": "envs"}

    question: Callable[[Row], str]
    answer: Callable[[Row], Any]

    def problem(self, row: Row, ident: str) -> Problem:
        gold = integer_of(str(self.answer(row)))
        if gold is None:
            raise ValueError(f"{ident}: answer {self.answer(row)!r} is not an integer")
        return Problem(ident, self.question(row), gold)

    def grade(self, problem: Problem, answer: str) -> Graded:
        boxes = boxed_contents(answer)
        values = {integer_of(b) if integer_of(b) is not None else normalize(b) for b in boxes}
        if not boxes:
            return Graded(None, False)
        if len(values) > 1:
            return Graded(" | ".join(boxes), False, {"boxed": boxes})
        box, value = boxes[-1], integer_of(boxes[-1])
        right = value == problem.gold if value is not None else check_math(box, problem.gold)
        return Graded(box, right)


@dataclass(frozen=True)
class Target(Format):
    """BBH: a free answer ("So the answer is X.") against the task's target string."""

    question: Callable[[Row], str]
    target: Callable[[Row], str]

    def problem(self, row: Row, ident: str) -> Problem:
        text = f"{self.question(row).strip()}\n\n{TARGET_INSTRUCTION}"
        return Problem(ident, text, str(self.target(row)).strip())

    def grade(self, problem: Problem, answer: str) -> Graded:
        return grade_target(answer, problem.gold)


@dataclass(frozen=True)
class Spans(Format):
    """DROP: answer spans ("Answer: X; Y") scored by exact match (right) and F1 (a detail)."""

    question: Callable[[Row], str]
    golds: Callable[[Row], list[list[str]]]  # the accepted answers, each a list of spans

    def problem(self, row: Row, ident: str) -> Problem:
        golds = [gold for gold in self.golds(row) if any(s.strip() for s in gold)]
        if not golds:
            raise ValueError(f"{ident}: the row has no gold answer")
        return Problem(ident, f"{self.question(row).strip()}\n\n{SPANS_INSTRUCTION}", golds)

    def grade(self, problem: Problem, answer: str) -> Graded:
        stated = last_answer(answer)
        if stated is None:
            return Graded(None, False, {"em": 0.0, "f1": 0.0})
        exact, f1 = best_scores(stated.split(";"), problem.gold)
        return Graded(stated, exact == 1.0, {"em": exact, "f1": f1})

    def extra_metrics(self, problems: list[Problem], graded: list[list[Graded]]) -> dict[str, Any]:
        return {"eval/em": mean_detail(graded, "em"), "eval/f1": mean_detail(graded, "f1")}

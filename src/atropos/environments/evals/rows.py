"""Reading the benchmarks' rows, in each dataset's own field layout (as its hub card gives it),
where a field needs more than a lookup; `catalog.py` names the rest inline.

>>> labelled_index({"choices": {"label": ["1", "2", "3"]}, "answerKey": "2"})
1
>>> drop_golds({"answer": {"number": "", "date": {"day": "", "month": "May", "year": "1990"},
...             "spans": []}})
[['May 1990']]
>>> agieval_options({"choices": ["(A)12", "(B) 14"]})
['12', '14']
>>> print(bbh_input({"input": "Which?", "choices": ["red", "blue"], "target_idx": 1}))
Which?
Options:
(A) red
(B) blue
>>> bbh_target({"input": "Which?", "choices": ["red", "blue"], "target_idx": 1})
'(B)'
"""

from __future__ import annotations

import ast
import random
import re
from typing import Any

from atropos.environments.evals.answers import LETTERS
from atropos.environments.evals.base import stable_seed
from atropos.environments.evals.formats import Row

__all__ = [
    "agieval_options",
    "agieval_query",
    "bbh_input",
    "bbh_target",
    "drop_golds",
    "listed",
    "labelled_index",
    "olympiad_golds",
    "olympiad_question",
    "pubmedqa_question",
    "shuffled",
    "yes_no",
]

_AGIEVAL_CUE = re.compile(r"\s*A:\s*Among A through [A-J], the answer is\s*$")
_OPTION_MARK = re.compile(r"^\s*\(?[A-J]\)\s*")


def bbh_input(row: Row) -> str:
    """BBH's question: `input` (lukaemon/bbh), with its options as "(A) text" lines when the
    row lists them apart (lighteval/bbh's `choices`)."""
    options = row.get("choices") or []
    lines = [f"({letter}) {option}" for letter, option in zip(LETTERS * 3, options, strict=False)]
    return "\n".join([str(row["input"]).strip(), *(["Options:", *lines] if lines else [])])


def bbh_target(row: Row) -> str:
    """BBH's target: `target`, or the right option's letter, "(B)", for a row giving
    `target_idx` instead (lighteval/bbh)."""
    if row.get("target") not in (None, ""):
        return str(row["target"])
    return f"({LETTERS[int(row['target_idx'])]})"


def labelled_index(row: Row, key: str = "answerKey") -> int:
    """ARC / OpenBookQA: the index of the right option, found by its label (`A`.. or `1`..)."""
    return [str(label) for label in row["choices"]["label"]].index(str(row[key]).strip())


def listed(value: Any) -> list[str]:
    """A list field that some datasets store as its Python text (MuSR's `choices`)."""
    found = ast.literal_eval(value) if isinstance(value, str) else value
    return [str(item) for item in found]


def yes_no(value: Any) -> str:
    """BoolQ's answer, a bool (google/boolq) or "Yes"/"No" (lighteval/boolq_helm), as a word."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value).strip().lower()


def shuffled(row: Row) -> tuple[list[str], str]:
    """GPQA: the item's options in its own fixed shuffled order (seeded from its `Record ID`,
    else its question), and the right one's letter."""
    right = str(row["Correct Answer"]).strip()
    options = [right, *(str(row[f"Incorrect Answer {i}"]).strip() for i in (1, 2, 3))]
    order = list(range(len(options)))
    random.Random(stable_seed("gpqa", str(row.get("Record ID") or row["Question"]))).shuffle(order)
    return [options[i] for i in order], LETTERS[order.index(0)]


def agieval_query(row: Row) -> str:
    """AGIEval's `query` without its closing completion cue ("A: Among A through E, the
    answer is"); the options follow as lettered lines."""
    return _AGIEVAL_CUE.sub("", str(row["query"]))


def agieval_options(row: Row) -> list[str]:
    """AGIEval's `choices` without their "(A)" marks."""
    return [_OPTION_MARK.sub("", str(choice)).strip() for choice in row["choices"]]


def _date(date: Any) -> str:
    if not isinstance(date, dict):
        return ""
    return " ".join(str(date.get(k) or "").strip() for k in ("day", "month", "year")).strip()


def _answer_spans(number: Any, date: Any, spans: Any) -> list[str]:
    if str(number or "").strip():
        return [str(number).strip()]
    if spans:
        return [str(s) for s in spans]
    return [_date(date)] if _date(date) else []


def drop_golds(row: Row) -> list[list[str]]:
    """DROP: the accepted answers (`answer`, then each of `validated_answers`), each as its
    spans: a number, a date ("day month year"), or passage spans."""
    answer = row["answer"]
    golds = [_answer_spans(answer.get("number"), answer.get("date"), answer.get("spans"))]
    valid = row.get("validated_answers") or {}
    numbers, dates, spans = (valid.get(k) or [] for k in ("number", "date", "spans"))
    for i in range(max(len(numbers), len(dates), len(spans))):
        at = (seq[i] if i < len(seq) else None for seq in (numbers, dates, spans))
        golds.append(_answer_spans(*at))
    return [gold for gold in golds if gold]


def pubmedqa_question(row: Row) -> str:
    """PubMedQA: the abstract's sections (`context.contexts`), then the question."""
    context = row.get("context") or {}
    sections = context.get("contexts", []) if isinstance(context, dict) else context
    return "Context:\n" + "\n".join(map(str, sections)) + f"\n\nQuestion: {row['question']}"


def olympiad_golds(row: Row) -> list[str]:
    """OlympiadBench's `final_answer` list, without `$` signs."""
    answers = row["final_answer"]
    answers = answers if isinstance(answers, list) else [answers]
    return [str(answer).strip().strip("$").strip() for answer in answers]


def olympiad_question(row: Row) -> str:
    """OlympiadBench's question with what its answer must look like: the unit to leave out,
    and one box of comma-separated answers when there are several."""
    notes = []
    if row.get("is_multiple_answer"):
        notes.append(
            "The problem has several answers: give them all in one \\boxed{}, separated by commas."
        )
    if str(row.get("unit") or "").strip():
        notes.append(f"Give the answer in {str(row['unit']).strip()}, without the unit.")
    return "\n\n".join([str(row["question"]).strip(), *notes])

"""`eval_mmlu`: MMLU (`cais/mmlu` or `lighteval/mmlu`, config `all`, split `test`), pass@k,
per subject; optional few-shot examples from the `dev` split.

Rows: `question`, `subject`, `choices` (four options), `answer` (the right option's index, or
its letter). The model answers "The best answer is: X"; the letter is read as in `mcqa`
(`answers.grade_choice`). `--env.few_shot K` puts the first K `dev` questions of the same
subject (with their answers) before the question; `--env.subjects a,b` keeps those subjects.

>>> env = MMLUEval(*MMLUEval.config_init())
>>> p = env.problem({"question": "2 + 3?", "subject": "elementary_mathematics",
...                  "choices": ["4", "5", "6", "7"], "answer": 1}, 0)
>>> p.gold, p.subsets, env.grade(p, "The best answer is: B").correct
('B', {'subject': 'elementary_mathematics'}, True)
>>> print(p.prompt)
The following is a multiple choice question about elementary mathematics.
<BLANKLINE>
2 + 3?
<BLANKLINE>
A. 4
B. 5
C. 6
D. 7
<BLANKLINE>
Answer with "The best answer is: X", where X is the letter of the right option.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from atropos.environments.common.data_loading import data_path, load_hub, read_jsonl
from atropos.environments.evals.answers import (
    CHOICE_INSTRUCTION,
    LETTERS,
    choice_block,
    grade_choice,
)
from atropos.environments.evals.base import EvalConfig, EvalEnv, Graded, Problem
from atropos.environments.evals.suite import CommaList

__all__ = ["MMLUConfig", "MMLUEval", "gold_letter"]


def gold_letter(answer: Any) -> str:
    """MMLU's `answer` (an index, or already a letter) as a letter.

    >>> gold_letter(2), gold_letter("c"), gold_letter("1")
    ('C', 'C', 'B')
    """
    text = str(answer).strip()
    return LETTERS[int(text)] if text.isdigit() else text.upper()


class MMLUConfig(EvalConfig):
    """`eval_mmlu`'s settings."""

    few_shot: int = Field(default=0, ge=0, le=5, description="dev examples per question (0-5)")
    subjects: CommaList = Field(
        default=None, description="only these subjects, e.g. astronomy,virology (unset: all)"
    )


class MMLUEval(EvalEnv[MMLUConfig]):
    """MMLU multiple-choice questions; one stated letter, the right one."""

    name = "eval_mmlu"
    benchmark = "mmlu"
    fixture = "mmlu.jsonl"
    hub_dataset, hub_config, hub_split = "cais/mmlu", "all", "test"

    def keep(self, row: Mapping[str, Any]) -> bool:
        subjects = self.config.subjects
        return not subjects or str(row.get("subject")) in subjects

    @functools.cached_property
    def examples(self) -> dict[str, list[Mapping[str, Any]]]:
        """The few-shot pool: `dev` rows by subject (the hub's, or the fixture's)."""
        if not self.config.few_shot:
            return {}
        s = self.config
        if s.dataset_name:
            rows = load_hub(s.dataset_name, "dev", s.dataset_config or self.hub_config)
        else:
            rows = read_jsonl(data_path("evals", "mmlu_dev.jsonl"))
        pool: dict[str, list[Mapping[str, Any]]] = {}
        for row in rows:
            pool.setdefault(str(row.get("subject")), []).append(row)
        return pool

    def problem(self, row: Mapping[str, Any], index: int) -> Problem:
        subject, choices = str(row.get("subject") or ""), [str(c) for c in row["choices"]]
        letter = gold_letter(row["answer"])
        shots = self.examples.get(subject, [])[: self.config.few_shot]
        parts = [f"The following is a multiple choice question about {subject.replace('_', ' ')}."]
        parts += [
            f"{ex['question']}\n\n{choice_block(ex['choices'])}\n\nThe best answer is:"
            f" {gold_letter(ex['answer'])}"
            for ex in shots
        ]
        parts += [f"{row['question']}\n\n{choice_block(choices)}", CHOICE_INSTRUCTION]
        gold_text = choices[LETTERS.index(letter)] if letter in LETTERS[: len(choices)] else ""
        data = {"gold_text": gold_text, "few_shot": len(shots)}
        prompt = "\n\n".join(parts)
        return Problem(f"mmlu-{subject}-{index}", prompt, letter, {"subject": subject}, data)

    def grade(self, problem: Problem, answer: str) -> Graded:
        return grade_choice(answer, problem.gold, problem.data["gold_text"])

r"""`eval_math500`: MATH-500 (`HuggingFaceH4/MATH-500`, split `test`), pass@k, per level and
subject.

Rows: `problem`, `solution`, `answer`, `subject`, `level`, `unique_id`. The `\boxed{}` answer
after thinking is checked against `answer` by math-verify, then as normalised strings; boxes
with different answers are wrong. Accuracy is also broken down by `level` and `subject`.

>>> env = Math500Eval(*Math500Eval.config_init())
>>> row = {"problem": "1/2 + 1/4?", "answer": "\\frac{3}{4}", "subject": "Prealgebra", "level": 1}
>>> p = env.problem(row, 3)
>>> p.id, p.subsets, env.grade(p, r"\boxed{0.75}").correct
('math500-3', {'level': '1', 'subject': 'Prealgebra'}, True)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from atropos.environments.evals.answers import grade_boxed
from atropos.environments.evals.base import EvalEnv, Graded, Problem

__all__ = ["Math500Eval"]

PROMPT = "Solve the problem, then give the final answer as \\boxed{answer}."


class Math500Eval(EvalEnv):
    """MATH-500 competition problems; a \\boxed{} answer checked by math-verify."""

    name = "eval_math500"
    requires: ClassVar[dict[str, str]] = {"math_verify": "envs"}  # checked before a run
    benchmark = "math500"
    fixture = "math500.jsonl"
    hub_dataset, hub_config, hub_split = "HuggingFaceH4/MATH-500", None, "test"
    system_prompt = PROMPT

    def problem(self, row: Mapping[str, Any], index: int) -> Problem:
        subsets = {k: str(row[k]) for k in ("level", "subject") if row.get(k) is not None}
        pid = str(row.get("unique_id") or f"math500-{index}")
        return Problem(pid, str(row["problem"]), str(row["answer"]).strip(), subsets)

    def grade(self, problem: Problem, answer: str) -> Graded:
        return grade_boxed(answer, problem.gold)

r"""`eval_gsm8k`: GSM8K (`openai/gsm8k`, config `main`, split `test`), pass@k.

Gold: the text after the solution's last `#` (commas removed). A completion is right when its
`\boxed{}` answer (after thinking) equals it by math-verify or as normalised strings; no box
is unanswered and boxes with different answers are wrong.

>>> env = GSM8KEval(*GSM8KEval.config_init())
>>> p = env.problem({"question": "2 + 2?", "answer": "2 + 2 = 4\n#### 4"}, 0)
>>> p.id, p.gold, env.grade(p, r"It is \boxed{4}.").correct, env.grade(p, "4").extracted
('gsm8k-0', '4', True, None)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from atropos.environments.evals.answers import grade_boxed
from atropos.environments.evals.base import EvalEnv, Graded, Problem
from atropos.rewards.math import gsm8k_gold

__all__ = ["GSM8KEval"]


class GSM8KEval(EvalEnv):
    """GSM8K word problems; a \\boxed{} answer checked by math-verify (string fallback)."""

    name = "eval_gsm8k"
    requires: ClassVar[dict[str, str]] = {"math_verify": "envs"}  # checked before a run
    benchmark = "gsm8k"
    fixture = "gsm8k.jsonl"
    hub_dataset, hub_config, hub_split = "openai/gsm8k", "main", "test"
    system_prompt = "Solve the problem step by step, then give the final answer as \\boxed{answer}."

    def problem(self, row: Mapping[str, Any], index: int) -> Problem:
        return Problem(f"gsm8k-{index}", str(row["question"]), gsm8k_gold(str(row["answer"])))

    def grade(self, problem: Problem, answer: str) -> Graded:
        return grade_boxed(answer, problem.gold)

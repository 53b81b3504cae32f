r"""`eval_aime`: AIME (`HuggingFaceH4/aime_2024`, split `train`), pass@k; answers are integers
from 0 to 999.

The `\boxed{}` answer after thinking counts when it reads as the gold integer (`042`,
`42.0`, `\$42`, `42^\circ` are 42), else when math-verify finds it equal (`\frac{84}{2}`).
Boxes with different answers are wrong.

>>> env = AIMEEval(*AIMEEval.config_init())
>>> p = env.problem({"id": 60, "problem": "How many?", "answer": "042"}, 0)
>>> p.id, p.gold, [env.grade(p, t).correct for t in (r"\boxed{42}", r"\boxed{042}", "42")]
('aime-60', 42, [True, True, False])
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from atropos.environments.evals.answers import check_math, normalize
from atropos.environments.evals.base import EvalEnv, Graded, Problem, boxed_contents

__all__ = ["AIMEEval", "integer_of"]


def integer_of(text: str) -> int | None:
    """An answer as an integer, when it is written as one (`042`, `42.0`, `$42$`).

    >>> integer_of("042"), integer_of("42.00"), integer_of("4.5"), integer_of("x")
    (42, 42, None, None)
    """
    found = re.fullmatch(r"-?\d+", normalize(text))
    return int(found.group()) if found else None


class AIMEEval(EvalEnv):
    """AIME problems; the \\boxed{} integer must equal the gold (0 to 999)."""

    name = "eval_aime"
    requires: ClassVar[dict[str, str]] = {"math_verify": "envs"}  # checked before a run
    benchmark = "aime"
    fixture = "aime.jsonl"
    hub_dataset, hub_config, hub_split = "HuggingFaceH4/aime_2024", None, "train"
    system_prompt = (
        "Solve the problem. The answer is an integer from 0 to 999; give it as \\boxed{answer}."
    )

    def problem(self, row: Mapping[str, Any], index: int) -> Problem:
        gold = integer_of(str(row["answer"]))
        if gold is None:
            raise ValueError(f"AIME row {index}: answer {row['answer']!r} is not an integer")
        pid = f"aime-{row['id']}" if row.get("id") is not None else f"aime-{index}"
        return Problem(pid, str(row["problem"]), gold)

    def grade(self, problem: Problem, answer: str) -> Graded:
        boxes = boxed_contents(answer)
        values = {integer_of(b) if integer_of(b) is not None else normalize(b) for b in boxes}
        if not boxes:
            return Graded(None, False)
        if len(values) > 1:
            return Graded(" | ".join(boxes), False, {"boxed": boxes})
        box = boxes[-1]
        value = integer_of(box)
        right = value == problem.gold if value is not None else check_math(box, problem.gold)
        return Graded(box, right)

"""`eval_ifeval`: IFEval (`google/IFEval`, split `train`): strict and loose accuracy at the
prompt and the instruction level, through `atropos.environments.common.ifeval`.

Rows: `key`, `prompt`, `instruction_id_list`, `kwargs`. The response (after thinking) is
checked against every instruction strictly and loosely (IFEval's relaxations: markdown `*`
removed, first or last line dropped). A sample is correct when it follows every instruction
strictly (so `eval/accuracy` and pass@k are prompt-level strict); `eval/prompt_level_strict_acc`,
`eval/inst_level_strict_acc`, `eval/prompt_level_loose_acc` and `eval/inst_level_loose_acc`
are IFEval's four numbers over all samples.

>>> env = IFEvalEval(*IFEvalEval.config_init())
>>> p = env.problem({"key": 7, "prompt": "Say hi. No commas.",
...                  "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}, 0)
>>> g = env.grade(p, "Sure, here:\\nhi there")
>>> p.id, g.correct, g.details["strict"], g.details["loose"]
('ifeval-7', False, [False], [True])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from atropos.environments.evals.base import EvalEnv, Graded, Problem

__all__ = ["IFEvalEval"]


class IFEvalEval(EvalEnv):
    """IFEval's verifiable instructions; strict/loose prompt- and instruction-level accuracy."""

    name = "eval_ifeval"
    benchmark = "ifeval"
    fixture = "ifeval.jsonl"
    hub_dataset, hub_config, hub_split = "google/IFEval", None, "train"

    def problem(self, row: Mapping[str, Any], index: int) -> Problem:
        from atropos.environments.common import ifeval  # the checks load with the first problem

        ids = [str(i) for i in row["instruction_id_list"]]
        data = {"instructions": ifeval.scoring.from_ifeval(row)}
        pid = f"ifeval-{row['key']}" if row.get("key") is not None else f"ifeval-{index}"
        return Problem(pid, str(row["prompt"]), ids, {}, data)

    def grade(self, problem: Problem, answer: str) -> Graded:
        from atropos.environments.common import ifeval

        result = ifeval.scoring.follow(answer.strip(), problem.data["instructions"])
        details = {"strict": list(result.strict), "loose": list(result.loose)}
        return Graded(answer.strip(), all(result.strict), details)

    def extra_metrics(self, problems: list[Problem], graded: list[list[Graded]]) -> dict[str, Any]:
        from atropos.environments.common import ifeval

        results = []
        for problem, row in zip(problems, graded, strict=True):
            for g in row:  # an unclosed think block follows nothing
                none = (False,) * len(problem.gold)
                strict, loose = g.details.get("strict", none), g.details.get("loose", none)
                results.append(ifeval.scoring.PromptResult(tuple(strict), tuple(loose)))
        return {f"eval/{k}": v for k, v in ifeval.scoring.accuracy(results).items()}

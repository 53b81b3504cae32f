"""`mcqa`: multiple-choice academic questions answered after one think block.

A completion scores +1 when, after exactly one `<think>...</think>` pair, it states exactly one
answer and that answer is the gold letter; a wrong, truncated, unstated or repeated answer
scores -1. Answers are read after "The correct answer is", "The best answer is", "The answer is"
or "Thus, final answer" (colon, bold, parentheses and \\boxed{} allowed), from a bare
\\boxed{X}, or as the gold option's exact text after one of those phrases. Data: the shipped
fixture, or `NousResearch/AcademicMCQA` with a seeded 2% test split. Details: docs/math.md.

>>> item = {"ground_truth": "B", "answer": 1, "options": ["Oslo", "Paris", "Rome", "Bern"]}
>>> [score_text(item, t) for t in ("<think>hm</think> The best answer is: B",
...     "<think>hm</think> **The answer is Paris**", "<think>hm</think> \\\\boxed{b}")]
[1.0, 1.0, 1.0]
>>> [score_text(item, t) for t in ("The best answer is B", "<think>hm</think> A, or B?",
...     "<think>hm</think> The answer is B. The best answer is B.")]
[-1.0, -1.0, -1.0]
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from atropos.environments.common.choices import LETTERS, extract_answers
from atropos.environments.common.data_loading import in_prompt, load_train_test
from atropos.environments.common.held_out import HeldOutConfig, HeldOutEnv
from atropos.envs.simple import Rollout
from atropos.envs.types import Message
from atropos.rewards.group import too_short
from atropos.rewards.text import split_think

__all__ = [
    "MCQA",
    "THINKING_SYSTEM_PROMPT",
    "MCQAConfig",
    "demo_responder",
    "extract_answers",
    "load_split",
    "score_text",
]

THINKING_SYSTEM_PROMPT = (
    "You are a deep thinking AI. You may think for as long as you need, reasoning step by step"
    " and checking your own work, before you answer. Put your thoughts and internal monologue"
    " inside <think> </think> tags, then give your solution or response to the problem."
)
INSTRUCTION = 'Provide your answer by saying "The best answer is: {Answer}"'
HUB_DATASET = "NousResearch/AcademicMCQA"


def score_text(item: Mapping[str, Any], completion: str) -> float:
    """+1 for exactly one think pair then exactly one stated answer, the gold one; else -1."""
    answer = split_think(completion, ignore_case=True)  # upstream matched tags in any case
    if answer is None:
        return -1.0
    gold = str(item["ground_truth"]).strip().upper()
    options, index = item.get("options") or [], item.get("answer")
    gold_text = str(options[index]) if isinstance(index, int) and 0 <= index < len(options) else ""
    found = extract_answers(answer, gold, gold_text)
    return 1.0 if found == [gold] else -1.0


def _check(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    for key in ("prompt", "ground_truth"):
        if not isinstance(row.get(key), str):
            raise ValueError(f"{where}: expected a string {key!r}, got {row.get(key)!r:.60}")
    return dict(row)


def load_split(
    split: str, dataset_name: str | None = None, test_fraction: float = 0.02
) -> list[dict[str, Any]]:
    """The rows of `split` ("train" or "test"): the fixture's files, or the hub dataset's train
    split with `ceil(test_fraction * rows)` held out by a seeded shuffle (seed 42)."""
    return load_train_test("mcqa", split, dataset_name, test_fraction, _check)


class MCQAConfig(HeldOutConfig):
    """`mcqa`'s settings; the real data is `--env.dataset_name HUB_DATASET`
    (NousResearch/AcademicMCQA)."""

    test_fraction: float = Field(default=0.02, gt=0, lt=1, description="hub rows held out")
    eval_temperature: float = Field(default=0.5, ge=0, description="sampling temperature of eval")


class MCQA(HeldOutEnv[MCQAConfig]):
    """Multiple-choice questions; +1 for exactly one stated answer that is right, else -1."""

    name = "mcqa"
    system_prompt = THINKING_SYSTEM_PROMPT

    def check_row(self, row: dict[str, Any], where: str) -> dict[str, Any]:
        return _check(row, where)

    def prompt(self, item: Any) -> list[Message]:
        return [
            {"role": "system", "content": THINKING_SYSTEM_PROMPT},
            {"role": "user", "content": f"{item['prompt']}\n\n{INSTRUCTION}"},
        ]

    def score(self, item: Any, completion: str) -> float:
        return score_text(item, completion)

    def score_group(
        self, item: Any, rollouts: list[Rollout], scores: list[float]
    ) -> list[float] | None:
        scores = [
            -1.0 if r.finish_reason == "length" else s
            for r, s in zip(rollouts, scores, strict=True)
        ]
        if too_short([r.trained_tokens for r in rollouts]):
            self.drop("too_short")
            return None
        self.record_mean("train/percent_correct", (max(s, 0.0) for s in scores))
        return self.unless_all_equal(scores)

    def eval_sample(self, item: dict[str, Any], r: Rollout, score: float) -> dict[str, Any]:
        score = -1.0 if r.finish_reason == "length" else score
        return {"prompt": item["prompt"], "gold": item["ground_truth"], "completion": r.text,
                "finish_reason": r.finish_reason, "score": score}  # fmt: skip

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """One answer per held-out question at `eval_temperature` -> eval/percent_correct."""
        return {"eval/percent_correct": sum(s["score"] > 0 for s in samples) / len(samples)}


_turns = itertools.count()


@functools.cache
def _fixture() -> dict[str, dict[str, Any]]:
    return {row["prompt"]: row for split in ("train", "test") for row in load_split(split)}


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder for offline demos: for a fixture question, the right
    letter on every other call and the next letter on the others; None (random text) else."""
    row = in_prompt(_fixture(), prompt_text)
    if row is None:
        return None
    letter = row["ground_truth"]
    if next(_turns) % 2:
        letter = LETTERS[(LETTERS.index(letter) + 1) % len(row["options"])]
    return f"<think>Weighing each option in turn.</think> The best answer is: {letter}"

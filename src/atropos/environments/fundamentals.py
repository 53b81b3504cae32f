"""`fundamentals`: predict whether a company metric is maintained, raised or reduced next
quarter, and by how much (upstream's financial fundamentals environment).

After exactly one `<think>...</think>` pair, the answer must hold exactly one final sentence
"The {metric} will be: {direction} and the magnitude will be: {percent}%". Its raw score is 0
for a wrong direction or a bad format, else 1 + the magnitude band of |predicted - gold|
(1.0 for 0, 0.9 up to 1, 0.7 up to 5, 0.5 up to 10, 0.3 up to 20, else 0), minus
0.5 * length / max_token_length for completions over 95% of max_token_length. Training gets the
binarised reward: +1 when the raw score is positive, else -1. Details: docs/math.md.

>>> item = {"fundamental_metric": "dividend", "answer": "raised", "magnitude": "5"}
>>> raw_score(item, "<think>strong cash flow</think> The dividend will be: raised and the"
...     " magnitude will be: 3%")
1.7
>>> raw_score(item, "The dividend will be: raised and the magnitude will be: 5%")  # no think
0.0
>>> magnitude_band(0.5), magnitude_band(12), magnitude_band(25)
(0.9, 0.3, 0.0)
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from atropos.environments.common.data_loading import in_prompt, load_train_test
from atropos.environments.common.held_out import HeldOutConfig, HeldOutEnv
from atropos.envs.simple import Rollout
from atropos.envs.types import Message
from atropos.rewards.group import too_short
from atropos.rewards.text import split_think

__all__ = [
    "DIRECTIONS",
    "SYSTEM_PROMPT",
    "Fundamentals",
    "FundamentalsConfig",
    "demo_responder",
    "length_term",
    "load_split",
    "magnitude_band",
    "parse_prediction",
    "raw_score",
    "user_message",
]

HUB_DATASET = "NousResearch/company-fundamentals-prediction-lite"
DIRECTIONS = ("maintained", "raised", "reduced")
SYSTEM_PROMPT = (
    "You are a deep thinking AI financial analyst.\nYou may think for as long as you need,"
    " reasoning step by step and checking your own work, before you answer.\n\nPut your"
    " thoughts and internal monologue inside <think> </think> tags, then give your final"
    " prediction."
)
USER_TEMPLATE = """Analyse the company fundamentals, news and macroeconomic data below and \
predict whether the company's {metric} will be maintained, raised or reduced next quarter, and \
by how much.

Your final answer MUST use exactly this format:
"The {metric} will be: {{answer}} and the magnitude will be: {{percentage}}%"

where {{answer}} is one of "maintained", "raised" or "reduced", and {{percentage}} is the \
expected percentage change (0% if maintained).

The data:

{context}"""
BANDS = ((0.0, 1.0), (1.0, 0.9), (5.0, 0.7), (10.0, 0.5), (20.0, 0.3))  # (|diff| at most, score)


def user_message(item: Mapping[str, Any]) -> str:
    """The task for one item: instructions ending with the exact answer format, then data."""
    return USER_TEMPLATE.format(metric=item["fundamental_metric"], context=item["context"])


@functools.lru_cache(maxsize=1024)
def _sentence(metric: str) -> re.Pattern[str]:
    return re.compile(
        rf"The {re.escape(metric)} will be:\s*(maintained|raised|reduced)\s*and\s*the\s*"
        r"magnitude\s*will\s*be:\s*([-+]?\d+(?:\.\d+)?)%",
        re.IGNORECASE,
    )


def parse_prediction(completion: str, metric: str) -> tuple[str, float] | None:
    """(direction, magnitude) from the one final sentence after the one think pair; None for
    a missing or repeated think pair, or zero or several final sentences."""
    answer = split_think(completion, ignore_case=True)  # upstream matched tags in any case
    if answer is None:
        return None
    found = _sentence(metric).findall(answer)
    if len(found) != 1:
        return None
    direction, magnitude = found[0]
    return direction.lower(), float(magnitude)


def magnitude_band(diff: float) -> float:
    """The magnitude score of an absolute difference in percentage points."""
    return next((score for limit, score in BANDS if abs(diff) <= limit), 0.0)


def _gold_magnitude(item: Mapping[str, Any]) -> float | None:
    try:
        return abs(float(str(item["magnitude"]).strip().rstrip("%")))
    except (TypeError, ValueError):
        return None


def raw_score(item: Mapping[str, Any], completion: str) -> float:
    """0.0 for a bad format or a wrong direction, else 1 + the magnitude band (signs ignored:
    the direction carries the sign, so "reduced ... -5%" and "reduced ... 5%" agree)."""
    prediction = parse_prediction(completion, str(item["fundamental_metric"]))
    if prediction is None or prediction[0] != str(item["answer"]).strip().lower():
        return 0.0
    gold = _gold_magnitude(item)
    return 1.0 + (0.0 if gold is None else magnitude_band(abs(prediction[1]) - gold))


def length_term(completion_tokens: int, max_token_length: int) -> float:
    """The penalty for completions over 95% of the length limit: 0.5 * their share of it.

    >>> length_term(90, 100), length_term(96, 100)
    (0.0, 0.48)
    """
    if completion_tokens <= 0.95 * max_token_length:
        return 0.0
    return 0.5 * completion_tokens / max_token_length


def load_split(
    split: str, dataset_name: str | None = None, test_fraction: float = 0.05
) -> list[dict[str, Any]]:
    """The rows of `split` ("train" or "test"): the fixture's files, or the hub dataset's train
    split with `ceil(test_fraction * rows)` held out by a seeded shuffle (seed 42)."""
    return load_train_test("fundamentals", split, dataset_name, test_fraction)


class FundamentalsConfig(HeldOutConfig):
    """`fundamentals`' settings; the real data is `--env.dataset_name HUB_DATASET`
    (NousResearch/company-fundamentals-prediction-lite)."""

    binary_reward: bool = Field(
        default=True, description="train on +1/-1 (upstream); false: the raw score"
    )
    eval_temperature: float = Field(default=0.2, ge=0, description="sampling temperature of eval")


class Fundamentals(HeldOutEnv[FundamentalsConfig]):
    """Direction and magnitude of a company metric's next change; binarised reward."""

    name = "fundamentals"
    system_prompt = SYSTEM_PROMPT
    temperature = 0.8

    def prompt(self, item: Any) -> list[Message]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": user_message(item)},
        ]

    def score(self, item: Any, completion: str) -> float:
        """The raw score (0 to 2) before the length term and binarisation."""
        return raw_score(item, completion)

    def score_group(
        self, item: Any, rollouts: list[Rollout], scores: list[float]
    ) -> list[float] | None:
        lengths = [r.trained_tokens for r in rollouts]
        if too_short(lengths):
            self.drop("too_short")
            return None
        limit = self.config.max_token_length
        self.record_mean("train/direction_accuracy", (float(raw >= 1.0) for raw in scores))
        self.record_mean("train/magnitude_accuracy", (raw - 1.0 for raw in scores if raw >= 1.0))
        final = [raw - length_term(n, limit) for raw, n in zip(scores, lengths, strict=True)]
        if self.config.binary_reward:
            final = [1.0 if x > 0 else -1.0 for x in final]
        return self.unless_all_equal(final)

    def eval_sample(self, item: dict[str, Any], r: Rollout, score: float) -> dict[str, Any]:
        return {"metric": item["fundamental_metric"], "gold": item["answer"],
                "gold_magnitude": item["magnitude"], "completion": r.text,
                "finish_reason": r.finish_reason, "score": raw_score(item, r.text)}  # fmt: skip

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """eval/{direction_accuracy, magnitude_accuracy (over right directions),
        combined_score (mean raw score without the length term)}."""
        right = [s["score"] - 1.0 for s in samples if s["score"] >= 1.0]
        return {
            "eval/direction_accuracy": len(right) / len(samples),
            "eval/magnitude_accuracy": sum(right) / len(right) if right else 0.0,
            "eval/combined_score": sum(s["score"] for s in samples) / len(samples),
        }


_turns = itertools.count()


@functools.cache
def _fixture() -> dict[str, dict[str, Any]]:
    return {row["context"]: row for split in ("train", "test") for row in load_split(split)}


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder for offline demos: for a fixture item, the right
    direction and magnitude on every other call and a wrong direction on the others; None
    (random text) for any other prompt."""
    row = in_prompt(_fixture(), prompt_text)
    if row is None:
        return None
    direction, magnitude = row["answer"], row["magnitude"]
    if next(_turns) % 2:
        direction = DIRECTIONS[(DIRECTIONS.index(direction) + 1) % 3]
    return (
        "<think>Reading the margins, the guidance and the macro backdrop.</think> The"
        f" {row['fundamental_metric']} will be: {direction} and the magnitude will be:"
        f" {magnitude}%"
    )

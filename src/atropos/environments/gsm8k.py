"""`gsm8k`: grade-school math word problems answered in \\boxed{}, checked by math-verify.

Upstream's rules: 1.0 when the text after a completion's last </think> verifies against the gold
(the answer after its last '#', commas removed, as \\boxed{gold}), else -1.0. Groups are dropped
for an unparsable gold, a completion under 10 tokens, or equal scores (if
`ensure_scores_are_not_same`); all-correct ones pay the length penalty. Eval: test split, n=1,
T=0.6. Data: the shipped fixture, or the hub (`--env.dataset_name gsm8k`); see docs/rewards.md.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar

from pydantic import Field

from atropos.environments.common.data_loading import data_path, load_hub, read_jsonl
from atropos.envs.config import BaseEnvConfig
from atropos.envs.simple import Env, Rollout
from atropos.inference.config import APIServerConfig, local_server_config
from atropos.rewards import all_equal, length_penalty, too_short
from atropos.rewards.math import gsm8k_correct, gsm8k_gold, parse_gold


class GSM8KConfig(BaseEnvConfig):
    dataset_name: str | None = Field(None, description="hub dataset (unset: shipped fixture)")
    dataset_config: str = Field("main", description="the hub dataset's configuration")


class GSM8K(Env):
    """Grade-school math word problems; +1 for the right \\boxed{} answer, else -1."""

    name = "gsm8k"
    requires: ClassVar[dict[str, str]] = {"math_verify": "envs"}  # checked before a run
    env_config_cls = GSM8KConfig
    seed = 42  # upstream's shuffle seed
    system_prompt = (
        "You are a careful problem solver. Reason step by step inside <think> </think> tags,"
        " then give the final answer as \\boxed{your answer}."
    )

    @classmethod
    def config_init(cls) -> tuple[GSM8KConfig, list[APIServerConfig]]:  # `atropos local serve`
        return GSM8KConfig(group_size=8, use_wandb=False), [local_server_config()]  # 2048 tokens

    def load(self, split: str = "train") -> list[dict[str, Any]]:
        if name := getattr(self.config, "dataset_name", None):
            return load_hub(name, split, getattr(self.config, "dataset_config", "main"))
        return read_jsonl(data_path("gsm8k", f"{split}.jsonl"))

    def load_eval(self) -> list[dict[str, Any]]:
        return self.load("test")

    def score(self, item: dict[str, Any], completion: str) -> float:
        return 1.0 if gsm8k_correct(item["answer"], completion) else -1.0

    def score_group(self, item: Any, rollouts: list[Rollout], scores: list[float]) -> Any:
        gold_ok = parse_gold(gsm8k_gold(item["answer"]))
        if not gold_ok or too_short([sum(m != -100 for m in r.masks) for r in rollouts]):
            return self.drop("too_short" if gold_ok else "bad_gold")
        lengths = [len(r.tokens) for r in rollouts]  # upstream: the whole sequence
        scores = length_penalty(scores, lengths, self.config.max_token_length)
        same = self.config.ensure_scores_are_not_same and all_equal(scores)
        return self.drop("all_equal") if same else scores

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        params = {"temperature": 0.6}  # upstream's (which it logged as 0.0)

        async def one(item: dict[str, Any]) -> dict[str, Any]:
            [r] = await self.generate(self.prompt(item), 1, "eval", **params)
            score, gold = self.score(item, r.text), gsm8k_gold(item["answer"])
            return {"question": item["question"], "gold": gold, "completion": r.text,
                    "finish_reason": r.finish_reason, "score": score}  # fmt: skip

        start, samples = time.time(), await asyncio.gather(*map(one, self.load_eval()))
        metrics = {"eval/percent_correct": sum(s["score"] > 0 for s in samples) / len(samples)}
        self.evaluate_log(metrics, None, None, start, time.time(), {**params, "n": 1}, samples)
        return metrics

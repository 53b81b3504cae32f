"""`gsm8k`: grade-school math word problems answered in \\boxed{}, checked by math-verify.
Upstream's rules, eval and data (shipped fixture, or the hub's): see docs/rewards.md."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from atropos.environments.common.data_loading import data_path, load_hub, read_jsonl
from atropos.envs.config import BaseEnvConfig
from atropos.envs.simple import Env, Rollout
from atropos.rewards import length_penalty, too_short
from atropos.rewards.math import gsm8k_correct, gsm8k_gold, parse_gold


class GSM8KConfig(BaseEnvConfig):
    dataset_name: str | None = Field(None, description="hub dataset (unset: shipped fixture)")
    dataset_config: str = Field("main", description="the hub dataset's configuration")
    eval_temperature: float = Field(0.6, ge=0, description="upstream's (it logged 0.0)")


class GSM8K(Env[GSM8KConfig]):
    """Grade-school math word problems; +1 for the right \\boxed{} answer, else -1."""

    name = "gsm8k"
    requires: ClassVar[dict[str, str]] = {"math_verify": "envs"}  # checked before a run
    seed = 42  # upstream's shuffle seed
    answer_marker = "\\boxed"  # none after the thinking: invalid/no_answer (scored -1)
    config_defaults: ClassVar[dict[str, Any]] = {"group_size": 8, "use_wandb": False}
    system_prompt = (
        "You are a careful problem solver. Reason step by step inside <think> </think> tags,"
        " then give the final answer as \\boxed{your answer}."
    )

    def load(self, split: str = "train") -> list[dict[str, Any]]:
        if name := self.config.dataset_name:
            return load_hub(name, split, self.config.dataset_config)
        return read_jsonl(data_path("gsm8k", f"{split}.jsonl"))

    def load_eval(self) -> list[dict[str, Any]]:
        return self.load("test")

    def score(self, item: dict[str, Any], completion: str) -> float:
        return 1.0 if gsm8k_correct(item["answer"], completion) else -1.0

    def score_group(self, item: Any, rollouts: list[Rollout], scores: list[float]) -> Any:
        gold_ok = parse_gold(gsm8k_gold(item["answer"]))
        if not gold_ok or too_short([r.trained_tokens for r in rollouts]):
            return self.drop("too_short" if gold_ok else "bad_gold")
        lengths = [len(r.tokens) for r in rollouts]  # upstream: the whole sequence
        return self.unless_all_equal(length_penalty(scores, lengths, self.config.max_token_length))

    def eval_sample(self, item: dict[str, Any], r: Rollout, score: float) -> dict[str, Any]:
        return {"question": item["question"], "gold": gsm8k_gold(item["answer"]),
                "completion": r.text, "finish_reason": r.finish_reason, "score": score}  # fmt: skip

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        return {"eval/percent_correct": sum(s["score"] > 0 for s in samples) / len(samples)}

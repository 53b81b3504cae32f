"""`MathEnv`: competition math with four modes, carried as a tag on each item.

- **normal**: solve the problem; +1/-1 by math-verify, a truncated answer is -1 with its
  advantage zeroed. All-correct groups may send their two least similar answers to **rlaif**
  and are kept only with a cosine length penalty (`percent_length_penalty`); mixed groups
  may send one right and one wrong answer to **judge** (`percent_to_judge`).
- **judge**: the policy verifies a stored solution with \\boxed{True|False}; a right verdict
  on a wrong solution is scored by a nested retry (the share of retries right), and a mixed
  retry group comes back as a **selfcorrect** item that replays it.
- **rlaif**: the judge (`--judge.*`, default the policy) prefers one of two correct answers,
  in both orders; the stored sequences are trained +1/-1 as a pair.

Replayed sequences (rlaif, selfcorrect) keep their original tokens, masks and logprobs.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from typing import Any, ClassVar

from pydantic import Field

from atropos.environments.math import data
from atropos.environments.math.groups import group_of, stored
from atropos.environments.math.prompts import (
    SYSTEM_PROMPT,
    judge_messages,
    retry_messages,
    rlaif_messages,
)
from atropos.environments.math.scoring import (
    cosine_length_scores,
    most_dissimilar,
    rlaif_vote,
    verdict,
    verify,
)
from atropos.envs.config import BaseEnvConfig
from atropos.envs.judge import JudgeConfig, JudgedEnv, compare
from atropos.envs.simple import Env, Rollout
from atropos.envs.types import Message, ScoredDataGroup
from atropos.inference.tokenize import template_ids
from atropos.rewards.group import all_equal, too_short
from atropos.rewards.math import after_think

__all__ = ["MODES", "MathConfig", "MathEnv"]

MODES = ("normal", "rlaif", "judge", "selfcorrect")
ZERO = {"set_advantage_to_zero": True}
Result = tuple[ScoredDataGroup | None, list[dict[str, Any]]]


class MathConfig(BaseEnvConfig):
    """`math`'s settings; the rlaif preference judge is configured with `--judge.*`."""

    dataset_name: str | None = Field(
        default=None, description=f"hub training set, e.g. {data.TRAIN_HUB} (unset: fixture)"
    )
    eval_from_hub: bool = Field(default=False, description="evaluate on aime24/math500/amc23")
    run_evaluation: bool = Field(default=True, description="run the evaluation at all")
    eval_max_tokens: int | None = Field(
        default=None, ge=1, description="eval answer budget (unset: max_token_length)"
    )
    mask_too_long_completions: bool = Field(
        default=True, description="zero the advantage of completions cut at max_tokens"
    )
    percent_to_judge: float = Field(
        default=0.3, ge=0, le=1, description="chance a mixed group sends a pair to judge mode"
    )
    percent_length_penalty: float = Field(
        default=0.1, ge=0, le=1, description="chance an all-correct group is length-penalised"
    )
    rlaif_max_similarity: float = Field(
        default=0.975, ge=0, le=1, description="correct pairs less alike than this go to rlaif"
    )
    min_completion_tokens: int = Field(
        default=1024, ge=1, description="skip problems leaving fewer tokens to answer in"
    )
    top_p: float = Field(default=0.95, gt=0, le=1, description="nucleus sampling of rollouts")
    random_seed: int = Field(default=42, description="seeds the judge and length-penalty draws")
    judge: JudgeConfig = Field(default_factory=JudgeConfig)


class MathEnv(Env[MathConfig], JudgedEnv):
    """Math problems in normal, judge, self-correct and rlaif modes (+1/-1 by math-verify)."""

    name = "math"
    requires: ClassVar[dict[str, str]] = {"math_verify": "envs"}  # checked before a run
    # the local server (`atropos local serve`), 2048 tokens
    config_defaults: ClassVar[dict[str, Any]] = {"group_size": 8, "use_wandb": False}
    system_prompt = SYSTEM_PROMPT
    seed = 42  # upstream's shuffle seed

    @property
    def counts(self) -> Counter[str]:
        """Counters since the start: groups made and items pushed, per mode."""
        return self.__dict__.setdefault("_counts", Counter())  # type: ignore[no-any-return]

    # ----- data -----------------------------------------------------------------------------

    def load(self) -> list[dict[str, Any]]:
        return data.train_items(self.config.dataset_name)

    def load_eval(self) -> list[dict[str, Any]]:
        return data.eval_items(self.config.eval_from_hub)

    def score(self, item: Any, completion: str) -> float:
        return 1.0 if verify(item["answer"], completion) else -1.0

    async def setup(self) -> None:
        await super().setup()
        self.draws = random.Random(self.config.random_seed)
        self.iter = 0

    # ----- modes ----------------------------------------------------------------------------

    async def collect_trajectories(self, item: Any) -> Result:
        mode = item.get("mode", "normal")
        if mode not in MODES:
            raise ValueError(f"unknown math mode {mode!r}; expected one of {MODES}")
        group, backlog = await getattr(self, f"collect_{mode}")(item)
        self.counts[f"{mode}_groups"] += group is not None
        for pushed in backlog:
            self.counts[f"pushed_{pushed['mode']}"] += 1
        return group, backlog

    async def collect_normal(self, item: dict[str, Any]) -> Result:
        """Solve; score; route all-correct groups to rlaif and mixed ones to judge."""
        s, messages = self.config, self.prompt(item)
        budget = self._budget(messages, s.min_completion_tokens)
        if budget is None:
            self.counts["skipped_long_prompts"] += 1
            self.drop("prompt_too_long")
            return None, []
        self.iter += 1
        rollouts = await self._sample(messages, budget)
        scores, overrides = [], []
        for r in rollouts:
            truncated = r.finish_reason == "length"
            right = False if truncated else verify(item["answer"], r.text)
            if right is None:  # the gold answer does not parse: nothing to learn from
                self.counts["dropped_bad_gold"] += 1
                self.drop("bad_gold")
                return None, []
            scores.append(1.0 if right else -1.0)
            overrides.append(dict(ZERO) if truncated else {})
        if too_short([r.trained_tokens for r in rollouts]):
            self.drop("too_short")
            return None, []
        self._record_normal(rollouts, scores, overrides)
        seqs = [stored(r, messages) for r in rollouts]
        backlog: list[dict[str, Any]] = []
        if all_equal(scores):
            if scores[0] != 1.0:
                self.drop("all_wrong")
                return None, []
            pair = self._rlaif_item(item, seqs)
            backlog += [pair] if pair else []
            if self.draws.random() >= s.percent_length_penalty:  # no length penalty this time
                self.drop("all_right")
                return None, backlog
            penalised = cosine_length_scores([len(seq["tokens"]) for seq in seqs])
            if penalised is None:
                self.drop("no_spread")
                return None, backlog
            scores = penalised
        elif self.draws.random() < s.percent_to_judge:
            backlog += self._judge_items(item, seqs, scores, overrides)
        if not s.mask_too_long_completions:
            overrides = [{} for _ in scores]
        return group_of(seqs, scores, overrides), backlog

    async def collect_rlaif(self, item: dict[str, Any]) -> Result:
        """The judge prefers one of two correct answers; the stored pair is trained +1/-1."""
        first, second = item["pair"]
        a, b = (after_think(seq["messages"][-1]["content"]) for seq in (first, second))
        question = item["question"]
        votes = await compare(
            self.judge, lambda x, y: rlaif_messages(question, x, y), a, b, parse=rlaif_vote
        )
        if votes.a == votes.b:  # a tie (or no parsed vote) teaches nothing
            self.drop("judge_tie" if votes.a else "no_judge_vote")
            return None, []
        scores = [1.0, -1.0] if votes.a > votes.b else [-1.0, 1.0]
        return group_of([first, second], scores, [{}, {}], {"group_size": 2}), []

    async def collect_judge(self, item: dict[str, Any]) -> Result:
        """The policy verifies a solution; right verdicts on wrong solutions earn the share of
        retries (solving again with the verification as a hint) that are right."""
        s, expected = self.config, item["expected"]
        messages = judge_messages(item["question"], item["solution"])
        budget = self._budget(messages, 1)
        if budget is None:
            self.drop("prompt_too_long")
            return None, []
        rollouts = await self._sample(messages, budget)
        right = [
            r.finish_reason != "length" and verdict(r.text, ("True", "False")) == expected
            for r in rollouts
        ]
        self.record_mean("judge_train/percent_judge_correct", [sum(right) / len(right)])
        if not any(right):
            self.drop("all_wrong")
            return None, []
        scores = [1.0 if ok else -1.0 for ok in right]
        overrides: list[dict[str, Any]] = [{} for _ in rollouts]
        for i, r in enumerate(rollouts):
            if r.finish_reason == "length" and s.mask_too_long_completions:
                overrides[i] = dict(ZERO)
        backlog: list[dict[str, Any]] = []
        if expected == "False":
            retried = [i for i, ok in enumerate(right) if ok]
            results = await asyncio.gather(*(self._retry(item, rollouts[i].text) for i in retried))
            for i, (share, pushed) in zip(retried, results, strict=True):
                scores[i] = share
                backlog += pushed
        seqs = [stored(r, messages) for r in rollouts]
        if all(x == 1.0 for x in scores) and self.draws.random() < s.percent_length_penalty:
            penalised = cosine_length_scores([len(seq["tokens"]) for seq in seqs])
            if penalised is None:
                self.drop("no_spread")
                return None, backlog
            scores = penalised
        elif all_equal(scores):
            self.drop("all_equal")
            return None, backlog
        return group_of(seqs, scores, overrides), backlog

    async def collect_selfcorrect(self, item: dict[str, Any]) -> Result:
        """Replay a stored retry group exactly (truncated answers: advantage zeroed)."""
        seqs, scores = item["sequences"], item["scores"]
        mask = self.config.mask_too_long_completions
        overrides = [
            dict(ZERO) if mask and seq["finish_reason"] == "length" else {} for seq in seqs
        ]
        return group_of(seqs, list(scores), overrides), []

    # ----- helpers --------------------------------------------------------------------------

    async def _retry(self, item: dict[str, Any], verification: str) -> tuple[float, list[Any]]:
        """Solve again with the verification; (share right, [selfcorrect item] if mixed)."""
        messages = retry_messages(item["question"], item["solution"], after_think(verification))
        budget = self._budget(messages, 1)
        if budget is None:
            return 0.0, []
        rollouts = await self._sample(messages, budget)
        scores = []
        for r in rollouts:  # truncated: 0 (and advantage zeroed on replay)
            scores.append(0.0 if r.finish_reason == "length" else self.score(item, r.text))
        share = sum(x == 1.0 for x in scores) / len(scores)
        self.record_mean("judge_train/judge_success_rate", [share])
        if all_equal(scores):
            return share, []
        sequences = [stored(r, messages) for r in rollouts]
        replay = {**_about(item), "mode": "selfcorrect", "sequences": sequences, "scores": scores}
        return share, [replay]

    def _rlaif_item(self, item: dict[str, Any], seqs: list[dict[str, Any]]) -> Any:
        texts = [after_think(seq["messages"][-1]["content"]) for seq in seqs]
        i, j, ratio = most_dissimilar(texts)
        if ratio >= self.config.rlaif_max_similarity:
            return None
        return {**_about(item), "mode": "rlaif", "pair": [seqs[i], seqs[j]], "similarity": ratio}

    def _judge_items(
        self, item: dict[str, Any], seqs: list[dict[str, Any]], scores: list[float], overrides: Any
    ) -> list[dict[str, Any]]:
        """The first right answer (expected "True") and the first wrong, finished one
        ("False"); none when every wrong answer was cut off."""
        right = scores.index(1.0)
        wrong = [i for i, x in enumerate(scores) if x == -1.0 and not overrides[i]]
        if not wrong:
            return []
        return [
            {
                **_about(item),
                "mode": "judge",
                "solution": after_think(seqs[i]["messages"][-1]["content"]),
                "expected": expected,
            }
            for i, expected in ((right, "True"), (wrong[0], "False"))
        ]

    def _budget(self, messages: list[Message], minimum: int) -> int | None:
        """Tokens left to answer in after the prompt; None when fewer than `minimum`."""
        used = len(template_ids(self.tokenizer, messages, add_generation_prompt=True))
        left = self.config.max_token_length - used
        return left if left >= minimum else None

    async def _sample(self, messages: list[Message], budget: int) -> list[Rollout]:
        s = self.config
        return await self.generate(
            messages, s.group_size, max_tokens=budget, temperature=1.0, top_p=s.top_p
        )

    def _record_normal(self, rollouts: list[Rollout], scores: list[float], overrides: Any) -> None:
        self.record_mean("train/percent_correct", [max(x, 0.0) for x in scores])
        self.record_mean(
            "train/percent_overanswer", [float(r.finish_reason == "length") for r in rollouts]
        )
        self.record_mean("train/pass_at_groupsize", [float(1.0 in scores)])
        for r, x, o in zip(rollouts, scores, overrides, strict=True):
            if x == 1.0:
                self.record_mean("train/avg_correct_answer_len", [len(r.tokens)])
            elif not o:
                self.record_mean("train/avg_incorrect_answer_len", [len(r.tokens)])

    # ----- logging and evaluation -----------------------------------------------------------

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        out = dict(metrics or {})
        out["train/iter"] = getattr(self, "iter", 0)
        out.update({f"train/math/{k}": float(v) for k, v in self.counts.items()})
        await super().wandb_log(out)

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """`Env.evaluate` unless `--env.run_evaluation false`."""
        return await super().evaluate() if self.config.run_evaluation else {}

    def eval_params(self) -> dict[str, Any]:
        """`eval_temperature` (0: greedy answers) and `eval_max_tokens`."""
        s = self.config
        return {**super().eval_params(), "max_tokens": s.eval_max_tokens or s.max_token_length}

    def eval_sample(self, item: dict[str, Any], r: Rollout, score: float) -> dict[str, Any]:
        """The item, the completion and its score: 1 right, 0 wrong."""
        right = float(score > 0)
        return {**item, "completion": r.text, "finish_reason": r.finish_reason, "score": right}

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """eval/{subset}_percent_correct and eval/overall_percent_correct."""
        by_subset: defaultdict[str, list[float]] = defaultdict(list)
        for sample in samples:
            by_subset[sample["subset"]].append(sample["score"])
        metrics = {f"eval/{k}_percent_correct": sum(v) / len(v) for k, v in by_subset.items()}
        metrics["eval/overall_percent_correct"] = sum(x["score"] for x in samples) / len(samples)
        return metrics


def _about(item: dict[str, Any]) -> dict[str, Any]:
    """What every derived item keeps of its problem."""
    return {"question": item["question"], "answer": item["answer"]}

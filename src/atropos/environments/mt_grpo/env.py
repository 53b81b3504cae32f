"""`MTGRPO`: the environment, its config, its groups with per-turn credit, and evaluation.

A group is `group_size` episodes of one task, each in its own token-exact session
(`episode.play_chat` or `episode.play_in_think`). Every turn is scored (`scoring.judge_turns`),
the answer gives the outcome (`scoring.outcome_reward`), and `common.turn_credit` turns them
into per-turn advantages (MT-GRPO's rule, or GRPO's outcome-only baseline) laid on each turn's
own tokens: the group's `advantages`, which the trainer uses in place of its own. `scores` are
the outcome rewards. A group whose advantages are all zero teaches nothing and is dropped
(`no_signal`; `--env.drop_zero_advantage false` keeps it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field

from atropos.environments.common.multiturn import node_group, require_token_servers
from atropos.environments.common.turn_credit import Rule, token_advantages_by_turn, turn_advantages
from atropos.environments.mt_grpo.episode import (
    Budgets,
    Episode,
    play_chat,
    play_in_think,
    system_prompt,
)
from atropos.environments.mt_grpo.scoring import answer_of, judge_turns, outcome_reward
from atropos.environments.mt_grpo.world import Task, load_tasks, load_world
from atropos.envs.base import BaseEnv
from atropos.envs.config import BaseEnvConfig
from atropos.envs.evaluation import Report, evaluate_each
from atropos.envs.limits import ToolLimitsConfig
from atropos.envs.outcome import with_outcomes
from atropos.envs.simple import ShuffledPasses
from atropos.envs.types import Item, ScoredDataGroup

__all__ = ["MTGRPO", "MTGRPOConfig", "Scored", "episode_group", "episode_metrics", "score_episode"]


class MTGRPOConfig(BaseEnvConfig, ToolLimitsConfig):
    """`mt_grpo`'s settings."""

    credit: Rule = Field(
        default="mt_grpo",
        description="mt_grpo (outcome plus turn advantages) or grpo (outcome only, the baseline)",
    )
    turn_coef: float = Field(default=1.0, ge=0, description="λ: weight of the turn advantages")
    discount: float = Field(
        default=1.0, ge=0, le=1, description="γ: weight of a later turn's advantage per turn"
    )
    tools_in_think: bool = Field(
        default=False, description="tool calls inside the thinking of one reply, not as turns"
    )
    data_dir: str | None = Field(
        default=None,
        description="a folder with world.json, train.jsonl and test.jsonl (unset: the shipped)",
    )
    drop_zero_advantage: bool = Field(
        default=True, description="drop a group whose advantages are all zero (it teaches nothing)"
    )
    extra_turns: int = Field(
        default=1, ge=0, description="turns allowed beyond the task's calls and the answer"
    )
    max_reply_tokens: int = Field(default=512, ge=1, description="token limit of one generation")
    temperature: float = Field(default=0.8, ge=0, description="sampling temperature (training)")
    eval_limit: int = Field(default=0, ge=0, description="held-out tasks per evaluation (0: all)")


@dataclass
class Scored:
    """An episode's rewards: each turn's (None: no turn-level reward), the answer it gave, the
    outcome, and which turns had a call due."""

    turn_rewards: list[float | None]
    outcome: float
    answer: str | None
    call_due: list[bool]

    @property
    def calls_right(self) -> list[float]:
        """1.0 or 0.0 for each turn at which a call was due (1.0: a needed call made exactly)."""
        pairs = zip(self.turn_rewards, self.call_due, strict=True)
        return [float(r == 1.0) for r, due in pairs if due]


def score_episode(episode: Episode, world: Any, think_required: bool) -> Scored:
    """Score every turn of `episode` against its task (`scoring.judge_turns`), and its answer."""
    judged = judge_turns([turn.text for turn in episode.turns], episode.task.calls, world)
    text = episode.answer_text
    answer = None if text is None else answer_of(text, think_required)
    outcome = outcome_reward(answer, episode.task.answer)
    return Scored([j.reward for j in judged], outcome, answer, [j.call_due for j in judged])


def episode_metrics(
    episodes: Sequence[Episode], scored: Sequence[Scored]
) -> dict[str, list[float]]:
    """Per-episode values of the logged metrics (`calls_right`: per turn with a call due)."""
    return {
        "accuracy": [x.outcome for x in scored],
        "answered": [float(e.answer_text is not None) for e in episodes],
        "turns": [float(len(e.turns)) for e in episodes],
        "calls_right": [v for x in scored for v in x.calls_right],
        "tool_results": [float(e.results) for e in episodes],
        "cut_stops": [float(e.cut_stops) for e in episodes],
        "drift_forks": [float(e.forks) for e in episodes],
    }


class MTGRPO(BaseEnv[MTGRPOConfig]):
    """Multi-turn tool use over a made-up atlas, with turn-level credit (MT-GRPO)."""

    name = "mt_grpo"
    config_defaults: ClassVar[dict[str, Any]] = {
        "group_size": 8, "max_token_length": 4096, "use_wandb": False,
        "ensure_scores_are_not_same": False,
    }  # fmt: skip
    seed: ClassVar[int] = 0

    async def setup(self) -> None:
        s = self.config
        require_token_servers(self)
        if s.tools_in_think and s.max_reasoning_tokens is not None:
            raise ValueError(
                "--env.tools_in_think true continues the thinking across tool calls, which a"
                " reasoning budget would cut: unset --env.max_reasoning_tokens"
            )
        self.world = load_world(s.data_dir)
        self.tasks = load_tasks("train", s.data_dir)
        self.test_tasks = load_tasks("test", s.data_dir)
        if not self.tasks:
            raise ValueError("mt_grpo: no training tasks")
        self.system = system_prompt(s.tools_in_think)
        self._passes = ShuffledPasses(self.tasks, self.seed)

    async def get_next_item(self) -> Item:
        return self._passes.next()

    async def play(
        self, task: Task, split: str = "train", temperature: float | None = None
    ) -> Episode:
        """One episode of `task` in its own token-exact session."""
        s = self.config
        budgets = Budgets(
            s.extra_turns, s.max_reply_tokens, s.max_token_length, s.max_tool_calls, s.max_seconds
        )
        play = play_in_think if s.tools_in_think else play_chat
        tokenizer = self.tokenizer  # before the servers, so they share it
        async with self.server.managed_server(tokenizer=tokenizer) as session:
            return await play(
                session, task, self.world, budgets, self.system,
                split=split, temperature=s.temperature if temperature is None else temperature,
            )  # fmt: skip

    async def collect_trajectories(self, item: Item) -> tuple[ScoredDataGroup | None, list[Item]]:
        task: Task = item
        s = self.config
        episodes = await asyncio.gather(*(self.play(task) for _ in range(s.group_size)))
        if any(e.node is None for e in episodes):
            self.drop("prompt_too_long")
            return None, []
        scored = [score_episode(e, self.world, s.tools_in_think) for e in episodes]
        for key, values in episode_metrics(episodes, scored).items():
            self.record_mean(f"train/{key}", values)
        rows = turn_advantages(
            [x.turn_rewards for x in scored], [x.outcome for x in scored],
            s.credit, s.turn_coef, s.discount,
        )  # fmt: skip
        advantages = [
            token_advantages_by_turn(e.node.masked_tokens, [t.span for t in e.turns], row)
            for e, row in zip(episodes, rows, strict=True)
            if e.node is not None
        ]
        if s.drop_zero_advantage and not any(a for seq in advantages for a in seq):
            self.drop("no_signal")
            return None, []
        group = episode_group(episodes, [x.outcome for x in scored], advantages)
        return with_outcomes(group, [e.outcome(s.truncated) for e in episodes]), []

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """One episode per held-out task at `eval_temperature` (0: greedy); logs `eval/accuracy`
        (outcome), `eval/calls_right`, `eval/answered`, `eval/turns` and one sample per task.

        `envs.evaluation.evaluate_each`, not `Env.evaluate`: an item is an episode of many
        turns."""
        s = self.config
        params = {"temperature": s.eval_temperature, "max_tokens": s.max_reply_tokens}
        tasks = self.test_tasks[: s.eval_limit or None]
        return await evaluate_each(self, tasks, self._eval_play, self._eval_report, params)

    async def _eval_play(self, task: Task) -> Episode | None:
        episode = await self.play(task, "eval", self.config.eval_temperature)
        return episode if episode.node is not None else None  # None: the prompt did not fit

    def _eval_report(self, played: list[tuple[Task, Episode]]) -> Report:
        episodes = [e for _, e in played]
        scored = [score_episode(e, self.world, self.config.tools_in_think) for e in episodes]
        found = episode_metrics(episodes, scored)
        metrics = {f"eval/{k}": sum(v) / len(v) for k, v in found.items() if v}
        samples = [
            {"id": e.task.id, "question": e.task.question, "expected": e.task.answer,
             "answer": x.answer, "score": x.outcome, "turn_rewards": x.turn_rewards,
             "stopped": e.stopped, "messages": e.messages}
            for e, x in zip(episodes, scored, strict=True)
        ]  # fmt: skip
        return metrics, samples


def episode_group(
    episodes: Sequence[Episode], scores: list[float], advantages: list[list[float]]
) -> ScoredDataGroup:
    """The group of played episodes: each one's token-exact sequence (the policy's tokens
    trained, prompt and tool results masked), the server's logprobs, the per-token advantages."""
    nodes = [e.node for e in episodes if e.node is not None]
    return node_group(nodes, scores, [e.messages for e in episodes], advantages)

"""`ToolUseMultiTurn`: the environment, its config and the token-exact rollout loop.

A group is `group_size` rollouts of one episode. Turn 0 is one `chat_turn` with `n=group_size`
on a `ManagedServer` session; every later turn continues each still-active rollout's own
sequence by token ids (its own `ManagedServer` over the same pinned server, holding only that
rollout's node, so two rollouts with the same text never share ids): the replayed messages are
appended as prompt tokens (masked, logprob 1.0) and the reply is trained with the server's
logprobs. A rollout stops at its first failed reply, or when the next turn would not fit in
`max_token_length`, or at `--env.max_seconds` (its `RolloutLimits`; the episode fixes the turns).
Outcomes (`envs.outcome`): a rollout stopped by the token budget or the seconds is
`truncated/tokens` or `truncated/seconds` under `--env.truncated`; a reply that cannot be read
as calls (no think block, text around the calls, a malformed call) is `invalid/<mismatch>`
(`invalid/malformed`), scored by the env's rule as before.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field

from atropos.environments.common.multiturn import (
    continue_alone,
    node_group,
    reply_room,
    require_token_servers,
)
from atropos.environments.tool_use_multiturn.episodes import (
    SCENARIOS,
    ExpectedTurn,
    ToolEpisode,
    load_episodes,
)
from atropos.environments.tool_use_multiturn.scoring import (
    MISMATCH_PENALTY,
    check_reply,
    episode_reward,
    group_scores,
    relevance_reward,
)
from atropos.envs.base import BaseEnv
from atropos.envs.config import BaseEnvConfig
from atropos.envs.evaluation import Report, evaluate_each
from atropos.envs.limits import LimitsConfig
from atropos.envs.outcome import invalid, truncated, with_outcomes
from atropos.envs.simple import ShuffledPasses
from atropos.envs.types import Item, ScoredDataGroup
from atropos.inference.sequence import MASKED, DriftKind, SequenceNode

__all__ = ["ToolUseMultiTurn", "ToolUseMultiTurnConfig", "Trajectory"]


class ToolUseMultiTurnConfig(BaseEnvConfig, LimitsConfig):
    """`tool_use_multiturn`'s settings."""

    dataset_name: str | None = Field(
        default=None,
        description="hub dataset, e.g. interstellarninja/toolace_hermes_sequential_tool_use"
        " (unset: the shipped fixture)",
    )
    test_fraction: float = Field(
        default=0.05, gt=0, lt=1, description="share of hub rows held out for evaluation"
    )
    scenarios: list[str] = Field(
        default_factory=lambda: list(SCENARIOS),
        description="scenarios to train and evaluate on (single, multistep, multiturn, relevance)",
    )
    scenario_hints: bool = Field(
        default=True, description="add the scenario's helper line to the system prompt"
    )
    require_think: bool = Field(
        default=True, description="a reply must open with one <think>...</think> block"
    )
    lenient_types: bool = Field(
        default=False, description='let a string match the number it spells ("3" and 3)'
    )
    max_gen_per_turn: int = Field(default=1024, ge=1, description="token limit of one reply")
    temperature: float = Field(default=0.8, ge=0, description="sampling temperature (training)")
    eval_limit: int = Field(
        default=128, ge=0, description="held-out episodes per evaluation (0: all of them)"
    )


_LIMIT = {"budget": "tokens", "max_seconds": "seconds"}  # `Trajectory.stopped` -> its limit
UNREADABLE = ("think", "format", "malformed")
"""The mismatches that are the policy's own fault of form (`invalid/<mismatch>`), not a
wrong call."""


@dataclass
class Trajectory:
    """One rollout of an episode: the conversation so far and its token-exact sequence.

    Attributes:
        messages: the context, then each reply and the messages replayed after it.
        node: the sequence (tokens, masks, logprobs) through the last reply.
        correct: expected calls matched so far.
        turns: replies given.
        mismatch: why a reply failed (`scoring.TurnCheck.mismatch`), None if none did.
        stopped: `mismatch`, `budget` or `max_seconds` when the rollout ended early, else None.
        relevance: a relevance episode's reward before the -1 floor (None otherwise).
    """

    messages: list[dict[str, str]]
    node: SequenceNode
    correct: int = 0
    turns: int = 0
    mismatch: str | None = None
    stopped: str | None = None
    relevance: float | None = None

    def outcome(self, rule: str) -> dict[str, Any]:
        """Its `overrides` entry: `truncated/<limit>` under `rule`, `invalid/<mismatch>` for a
        reply that is not calls, or `{}` (scored)."""
        if self.stopped in _LIMIT:
            return truncated(_LIMIT[self.stopped], rule)
        if self.mismatch in UNREADABLE:
            return invalid(self.mismatch)
        return {}

    @property
    def trained_tokens(self) -> int:
        """Tokens of the policy's own replies (what the length penalty counts)."""
        return sum(1 for m in self.node.masked_tokens if m != MASKED)


class ToolUseMultiTurn(BaseEnv[ToolUseMultiTurnConfig]):
    """Sequential and multi-turn tool use over replayed tool responses."""

    name = "tool_use_multiturn"
    config_defaults: ClassVar[dict[str, Any]] = {
        "group_size": 8, "max_token_length": 8192, "use_wandb": False
    }  # fmt: skip
    seed: ClassVar[int] = 0

    @property
    def _stats(self) -> dict[str, float]:
        """Counts since the last `wandb_log`: rollouts, right ones, reward sum, failed ones, and
        later turns whose re-rendered prompt did not extend the held tokens (`DriftKind.FORK`:
        the sequence restarted, so the earlier replies of that rollout are no longer trained)."""
        return self.__dict__.setdefault(  # type: ignore[no-any-return]
            "_rollout_stats",
            {"rollouts": 0.0, "correct": 0.0, "reward": 0.0, "mismatch": 0.0, "forks": 0.0},
        )

    # ----- data ---------------------------------------------------------------------------------

    def load(self, split: str = "train") -> list[ToolEpisode]:
        """The episodes of `split` ("train" or "test") under the current settings."""
        s = self.config
        return load_episodes(
            split, s.dataset_name, s.test_fraction, s.scenario_hints, tuple(s.scenarios)
        )

    async def setup(self) -> None:
        require_token_servers(self)
        unknown = set(self.config.scenarios) - set(SCENARIOS)
        if unknown:
            raise ValueError(f"unknown scenarios {sorted(unknown)}; choose from {SCENARIOS}")
        self.episodes = self.load("train")
        self.test_episodes = self.load("test")
        if not self.episodes:
            raise ValueError("tool_use_multiturn: no training episodes in the chosen scenarios")
        self._passes = ShuffledPasses(self.episodes, self.seed)

    async def get_next_item(self) -> Item:
        return self._passes.next()

    # ----- rollouts -----------------------------------------------------------------------------

    def judge(self, episode: ToolEpisode, trajectory: Trajectory, turn: int, reply: str) -> None:
        """Record `reply` to turn `turn`; a failed reply stops the rollout."""
        s, expected = self.config, episode.turns[turn]
        trajectory.turns += 1
        if not expected.calls:
            trajectory.relevance = relevance_reward(reply, s.require_think)
            return
        check = check_reply(reply, expected.calls, s.require_think, s.lenient_types)
        trajectory.correct += check.correct
        if check.mismatch is not None:
            trajectory.mismatch, trajectory.stopped = check.mismatch, "mismatch"

    def reward(self, episode: ToolEpisode, trajectory: Trajectory) -> float:
        """The episode reward of a finished rollout (`scoring`; non-positive becomes -1.0)."""
        if not episode.total_calls:
            value = trajectory.relevance
            value = -MISMATCH_PENALTY if value is None else value
            return value if value > 0 else -1.0
        mismatch = trajectory.mismatch is not None
        return episode_reward(episode.scenario, trajectory.correct, episode.total_calls, mismatch)

    async def play(
        self, episode: ToolEpisode, n: int, split: str = "train", temperature: float | None = None
    ) -> list[Trajectory] | None:
        """`n` rollouts of `episode`, token-exact; None when its context alone does not fit."""
        s, tokenizer = self.config, self.tokenizer  # the tokenizer before the servers
        context = list(episode.context)
        room = reply_room(tokenizer, context, s.max_token_length)
        if room < 1:
            return None
        sampling = {
            "split": split,
            "temperature": s.temperature if temperature is None else temperature,
        }
        async with self.server.managed_server(tokenizer=tokenizer) as session:
            first = await session.chat_turn(
                messages=context, n=n, max_tokens=min(s.max_gen_per_turn, room), **sampling
            )
            trajectories = []
            for content, node in zip(first.contents, first.nodes, strict=True):
                trajectory = Trajectory([*context, {"role": "assistant", "content": content}], node)
                self.judge(episode, trajectory, 0, content)
                trajectories.append(trajectory)
            limits, started = s.rollout_limits(), time.monotonic()
            for t in range(1, len(episode.turns)):
                live = [tr for tr in trajectories if tr.stopped is None]
                if not live:
                    break
                if limits.exceeded(seconds=time.monotonic() - started):
                    for tr in live:
                        tr.stopped = "max_seconds"
                    break
                await asyncio.gather(
                    *(self._next_turn(session, episode, tr, t, sampling) for tr in live)
                )
        return trajectories

    async def _next_turn(
        self,
        session: Any,
        episode: ToolEpisode,
        trajectory: Trajectory,
        t: int,
        sampling: dict[str, Any],
    ) -> None:
        """Replay turn `t`'s messages after the rollout's last reply and sample its reply."""
        expected: ExpectedTurn = episode.turns[t]
        messages = [*trajectory.messages, *expected.replay]
        s = self.config
        room = reply_room(session.tokenizer, messages, s.max_token_length)
        if room < 1:
            trajectory.stopped = "budget"
            return
        turn = await continue_alone(
            session, trajectory.node, messages, max_tokens=min(s.max_gen_per_turn, room), **sampling
        )
        trajectory.node = turn.nodes[0]
        if trajectory.node.drift is DriftKind.FORK:
            self._stats["forks"] += 1
        trajectory.messages = [*messages, {"role": "assistant", "content": turn.contents[0]}]
        self.judge(episode, trajectory, t, turn.contents[0])

    async def collect_trajectories(self, item: Item) -> tuple[ScoredDataGroup | None, list[Item]]:
        episode: ToolEpisode = item
        trajectories = await self.play(episode, self.config.group_size)
        if not trajectories:  # its context alone does not fit
            self.drop("prompt_too_long")
            return None, []
        rewards = [self.reward(episode, tr) for tr in trajectories]
        stats = self._stats
        stats["rollouts"] += len(rewards)
        stats["correct"] += sum(1 for r in rewards if r >= 1.0)
        stats["reward"] += sum(rewards)
        stats["mismatch"] += sum(1 for tr in trajectories if tr.mismatch is not None)
        scores = group_scores(
            episode.scenario,
            rewards,
            [tr.trained_tokens for tr in trajectories],
            self.config.max_token_length,
            self.config.ensure_scores_are_not_same,
        )
        if scores is None:
            self.drop("all_equal")
            return None, []
        nodes = [tr.node for tr in trajectories]
        group = node_group(nodes, scores, [tr.messages for tr in trajectories])
        return with_outcomes(group, [tr.outcome(self.config.truncated) for tr in trajectories]), []

    # ----- metrics and evaluation ---------------------------------------------------------------

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        metrics = dict(metrics or {})
        stats = self._stats
        if stats["rollouts"]:
            n = stats["rollouts"]
            metrics["train/percent_correct"] = stats["correct"] / n
            metrics["train/avg_reward"] = stats["reward"] / n
            metrics["train/mismatch_rate"] = stats["mismatch"] / n
            metrics["train/drift_forks"] = stats["forks"]
            stats.update(dict.fromkeys(stats, 0.0))
        await super().wandb_log(metrics)

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """One rollout per held-out episode at `eval_temperature` (0: greedy); logs
        `eval/avg_reward` and `eval/percent_correct` (the share scoring at least 1.0).

        `envs.evaluation.evaluate_each`, not `Env.evaluate`: an episode is a multi-turn
        conversation."""
        s = self.config
        params = {"temperature": s.eval_temperature, "max_tokens": s.max_gen_per_turn}
        episodes = self.test_episodes[: s.eval_limit or None]
        return await evaluate_each(self, episodes, self._eval_play, self._eval_report, params)

    async def _eval_play(self, episode: ToolEpisode) -> Trajectory | None:
        played = await self.play(episode, 1, "eval", self.config.eval_temperature)
        return played[0] if played else None

    def _eval_report(self, played: list[tuple[ToolEpisode, Trajectory]]) -> Report:
        samples: list[dict[str, Any]] = [
            {
                "id": episode.id,
                "scenario": episode.scenario,
                "messages": trajectory.messages,
                "score": self.reward(episode, trajectory),
                "correct_calls": trajectory.correct,
                "expected_calls": episode.total_calls,
                "mismatch": trajectory.mismatch,
            }
            for episode, trajectory in played
        ]
        scores = [float(x["score"]) for x in samples]
        metrics = {
            "eval/avg_reward": sum(scores) / len(scores),
            "eval/percent_correct": sum(1 for x in scores if x >= 1.0) / len(scores),
        }
        return metrics, samples

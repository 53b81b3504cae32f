"""The multi-turn episode loop the game environments share, and the groups it becomes.

A game is played as one chat: the rules as the system turn, each observation as a user turn,
each move as an assistant turn. Every turn goes through `ManagedServer.chat_turn`, which extends
the conversation's held token ids instead of re-tokenizing it, so a sequence's trained tokens
are exactly what the policy generated (all its assistant turns), the system and observation
turns are masked (-100), and the logprobs are the server's. A game is anything with:

- `done`: whether the episode is over (the game's own end, or an invalid move);
- `observation() -> str`: the user turn describing the current state;
- `act(reply) -> None`: read the move from the policy's reply and play it.

An episode stops when the game is done, or at a limit of its `RolloutLimits` (`max_turns`
replies, `--env.max_seconds`), or when the next turn might not fit in `max_token_length` (the
held tokens, the next observation and a full reply). An episode cut so is `truncated/turns`,
`truncated/seconds` or `truncated/tokens` (`atropos.envs.outcome`), scored as it stands or
masked by `--env.truncated` (`outcome_entries`).

>>> centered([1.0, 0.0, 0.5])
[0.5, -0.5, 0.0]
>>> token_advantages([-100, -100, 7, 8], 0.5)
[0.0, 0.0, 0.5, 0.5]
"""

from __future__ import annotations

import asyncio
import time
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from pydantic import Field
from typing_extensions import TypeVar

from atropos.environments.common.multiturn import node_group
from atropos.envs.base import BaseEnv
from atropos.envs.config import BaseEnvConfig
from atropos.envs.evaluation import Report, evaluate_each
from atropos.envs.limits import LimitsConfig
from atropos.envs.outcome import RolloutLimits, truncated, with_outcomes
from atropos.envs.types import Item, ScoredDataGroup
from atropos.inference.managed import ChatTurn
from atropos.inference.sequence import MASKED, PROMPT_LOGPROB, SequenceNode

__all__ = [
    "Episode",
    "Game",
    "GameConfig",
    "GameConfigT",
    "GameEnv",
    "centered",
    "episode_group",
    "fits_next_turn",
    "outcome_entries",
    "play",
    "step_group",
    "token_advantages",
]

_TEMPLATE_SLACK = 16  # tokens a chat template may add around one user turn


class Game(Protocol):
    """What `play` needs from a game (see the module docstring)."""

    done: bool

    def observation(self) -> str: ...

    def act(self, reply: str) -> None: ...


@dataclass
class Episode:
    """One played episode: the game in its final state and the whole conversation."""

    game: Any
    node: SequenceNode  # prompt + every turn, token-exact, assistant turns trained
    turns: int  # replies the policy gave
    limit: str | None = None  # the limit that stopped it (turns, tokens, seconds), not the game

    @property
    def truncated(self) -> bool:
        """Whether a limit stopped it, not the game."""
        return self.limit is not None


def fits_next_turn(
    session: Any, held: SequenceNode, observation: str, reply_tokens: int, max_token_length: int
) -> bool:
    """Whether the held conversation, the next observation and a full reply fit in
    `max_token_length` (with a few tokens of slack for the chat template)."""
    upcoming = len(session.tokenizer.encode(observation, add_special_tokens=False))
    return len(held.tokens) + upcoming + _TEMPLATE_SLACK + reply_tokens <= max_token_length


async def play(
    session: Any,
    game: Game,
    system: str,
    *,
    max_token_length: int,
    reply_tokens: int,
    limits: RolloutLimits | None = None,
    max_turns: int | None = None,
    **sampling: Any,
) -> Episode:
    """Play `game` through `session` (a `ManagedServer`) until it ends or a limit is hit
    (`limits`; `max_turns` alone is `RolloutLimits(max_turns=...)`)."""
    limits = limits or RolloutLimits(max_turns=max_turns)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    node: SequenceNode | None = None
    turns, started, limit = 0, time.monotonic(), None
    while not game.done:
        limit = limits.exceeded(turns=turns, seconds=time.monotonic() - started)
        if limit is not None:
            break
        observation = game.observation()
        if node is not None and not fits_next_turn(
            session, node, observation, reply_tokens, max_token_length
        ):
            limit = "tokens"
            break
        messages.append({"role": "user", "content": observation})
        turn = await session.chat_turn(messages=messages, n=1, max_tokens=reply_tokens, **sampling)
        node = turn.nodes[0]
        messages.append({"role": "assistant", "content": turn.contents[0]})
        game.act(turn.contents[0])
        turns += 1
    if node is None:
        raise ValueError("the game was over before its first turn")
    return Episode(game, node, turns, limit if not game.done else None)


def outcome_entries(episodes: list[Episode], rule: str) -> list[dict[str, Any]]:
    """Each episode's outcome entry (`truncated/<limit>` under `rule`, `{}` when the game
    ended it), for `envs.outcome.with_outcomes`."""
    return [truncated(e.limit, rule) if e.limit else {} for e in episodes]


def _policy_version(nodes: list[SequenceNode]) -> dict[str, Any]:
    versions = [n.policy_version for n in nodes if n.policy_version is not None]
    return {"policy_version": min(versions)} if versions else {}


def episode_group(episodes: list[Episode], scores: list[float]) -> ScoredDataGroup:
    """A group of whole episodes: every assistant turn trained, the observations masked."""
    nodes = [e.node for e in episodes]
    return node_group(nodes, scores, [n.messages for n in nodes])


def centered(scores: list[float]) -> list[float]:
    """Each score minus the group's mean: the per-step advantage (no division by the spread,
    so alternatives that differ only by the small length tie-break get small advantages)."""
    mean = sum(scores) / len(scores)
    return [s - mean for s in scores]


def token_advantages(masks: list[int], advantage: float) -> list[float]:
    """`advantage` on every trained position of a sequence, 0.0 on masked ones."""
    return [0.0 if m == MASKED else advantage for m in masks]


def step_group(turn: ChatTurn, scores: list[float]) -> ScoredDataGroup:
    """A group of one step's alternatives (the `n` choices of `turn`): only this step's reply
    is trained (earlier turns were trained in their own step's group), with token-level
    `advantages` (the centered scores, broadcast over the reply's tokens)."""
    start = len(turn.prompt_tokens)
    masks = [[MASKED] * start + n.masked_tokens[start:] for n in turn.nodes]
    logprobs = [[PROMPT_LOGPROB] * start + n.logprobs[start:] for n in turn.nodes]
    group: dict[str, Any] = {
        "tokens": [n.tokens for n in turn.nodes],
        "masks": masks,
        "scores": [float(s) for s in scores],
        "advantages": [
            token_advantages(m, a) for m, a in zip(masks, centered(scores), strict=True)
        ],
        "inference_logprobs": logprobs,
        "messages": [n.messages for n in turn.nodes],
        "token_source": turn.nodes[0].token_source,
        **_policy_version(turn.nodes),
    }
    return group  # type: ignore[return-value]


class GameConfig(BaseEnvConfig, LimitsConfig):
    """Settings shared by the game environments (`LimitsConfig`: `max_seconds`, `truncated`)."""

    max_turns: int = Field(default=10, ge=1, description="replies per episode at most")
    reply_tokens: int = Field(default=512, ge=1, description="token limit of one reply")
    temperature: float = Field(default=0.5, ge=0, description="sampling temperature (training)")
    first_seed: int = Field(default=0, ge=0, description="env seed of the first training item")
    eval_episodes: int = Field(default=100, ge=1, description="episodes per evaluation")
    eval_seed: int = Field(default=1_000_000, ge=0, description="env seed of the first eval one")


GameConfigT = TypeVar("GameConfigT", bound=GameConfig, default=GameConfig)


class GameEnv(BaseEnv[GameConfigT]):
    """A game environment: items are env seeds; a group is `group_size` episodes of one seed
    (the same deal, so the episodes differ only by the policy's moves). Generic over its
    config (`GameConfig` unless a subclass names its own)."""

    env_config_cls: ClassVar[type[BaseEnvConfig]] = GameConfig  # the generic default's
    config_defaults: ClassVar[dict[str, Any]] = {
        "group_size": 8, "max_token_length": 4096, "use_wandb": False
    }  # fmt: skip
    rules: ClassVar[str] = ""  # the system turn

    @abstractmethod
    def new_game(self, seed: int) -> Any:
        """A fresh game dealt from `seed`."""

    @abstractmethod
    def score(self, game: Any) -> float:
        """The score of a finished (or cut) episode."""

    def record(self, episodes: list[Episode]) -> None:
        """Keep what `wandb_log` reports about training episodes (nothing by default)."""

    @abstractmethod
    def eval_metrics(self, episodes: list[Episode]) -> dict[str, float]:
        """The metrics of an evaluation's episodes."""

    async def get_next_item(self) -> Item:
        seed = self.__dict__.setdefault("_next_seed", self.config.first_seed)
        self._next_seed = seed + 1
        return {"seed": seed}

    async def play_one(self, seed: int, split: str = "train", **sampling: Any) -> Episode:
        """One episode of the game dealt from `seed`, in its own token-exact session."""
        s = self.config
        tokenizer = self.tokenizer  # before the servers, so they share it
        async with self.server.managed_server(tokenizer=tokenizer) as session:
            return await play(
                session,
                self.new_game(seed),
                self.rules,
                limits=s.rollout_limits(max_turns=s.max_turns),
                max_token_length=s.max_token_length,
                reply_tokens=s.reply_tokens,
                split=split,
                **{"temperature": s.temperature, **sampling},
            )

    async def collect_trajectories(
        self, item: Item
    ) -> tuple[ScoredDataGroup | list[ScoredDataGroup | None] | None, list[Item]]:
        seed = int(item["seed"])
        episodes = await asyncio.gather(
            *(self.play_one(seed) for _ in range(self.config.group_size))
        )
        self.record(list(episodes))
        group = episode_group(list(episodes), [self.score(e.game) for e in episodes])
        return with_outcomes(group, outcome_entries(list(episodes), self.config.truncated)), []

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """`eval_episodes` episodes from `eval_seed` on, one sample each; metrics and samples
        go to `data_dir_to_save_evals` (`metrics.json`, `samples.jsonl`).

        `envs.evaluation.evaluate_each`, not `Env.evaluate`: an item is a game played over
        many turns."""
        s = self.config
        params = {"temperature": s.eval_temperature, "max_tokens": s.reply_tokens}
        seeds = list(range(s.eval_seed, s.eval_seed + s.eval_episodes))
        return await evaluate_each(self, seeds, self._eval_play, self._eval_report, params)

    async def _eval_play(self, seed: int) -> Episode:
        return await self.play_one(seed, "eval", temperature=self.config.eval_temperature)

    def _eval_report(self, played: list[tuple[int, Episode]]) -> Report:
        samples = [
            {"seed": seed, "messages": e.node.messages, "score": self.score(e.game)}
            for seed, e in played
        ]
        return self.eval_metrics([e for _, e in played]), samples

"""An Atropos environment as a stepped episode, for a protocol that serves it (OpenEnv).

`episode_source(env)` gives `start(seed) -> Published` for three kinds of environment:

- **single-turn** (`envs.simple.Env`: gsm8k, tool_calling, ...): the episode is the item the
  seed picks (items in the env's order, seed modulo their number); the first observation is
  its prompt; one step takes the reply (text; a tool call stays in the text, written as the
  chat template writes it) and ends the episode with the env's `score` as the reward.
- **games** (`GameEnv`: blackjack, taxi, ...): the game dealt from the seed; each step plays
  one reply (`act`); the reward is 0 until the game is done, then the env's `score(game)`.
- **textworld**: the game of the seed's item; each step plays one reply; the reward is that
  turn's score change over the game's maximum (`TextGame.rewards`), so the return is the share
  of points scored.

Anything else (an env whose rollout loop is its own: mcp_tools, the agent environments) is
refused with a message naming the three kinds. An episode stepped after it is done, or
stepped past `max_turns` (the env's own when it has one, else 1 for single-turn), is done.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from atropos.envs.base import BaseEnv
from atropos.envs.simple import Env

__all__ = ["Published", "episode_source"]


@dataclass
class Published:
    """One served episode: what the client sees first, and `step(reply)`."""

    prompt: str
    messages: list[dict[str, Any]]
    act: Callable[[str], Awaitable[tuple[str, float, bool]]]
    max_turns: int
    turns: int = 0
    done: bool = False
    rewards: list[float] = field(default_factory=list)
    close: Callable[[], None] = lambda: None  # what the episode holds (a game process)

    async def step(self, reply: str) -> tuple[str, float, bool]:
        """(the next observation's text, this step's reward, done)."""
        if self.done:
            return "the episode is over: reset to start another", 0.0, True
        text, reward, done = await self.act(reply)
        self.turns += 1
        self.done = done or self.turns >= self.max_turns
        self.rewards.append(reward)
        return text, reward, self.done


Source = Callable[[int], Awaitable[Published]]


def episode_source(env: BaseEnv[Any]) -> Source:
    """`start(seed)` for `env` (after its `setup`); ValueError for an env it cannot step."""
    if isinstance(env, Env):
        return _single_turn(env)
    if hasattr(env, "new_game"):
        return _game(env)
    if hasattr(env, "game_file") and hasattr(env, "rules"):
        return _textworld(env)
    raise ValueError(
        f"{env.name or type(env).__name__} runs its own rollout loop: only single-turn"
        " environments (atropos.envs.simple.Env), games (GameEnv) and textworld can be published"
    )


def _single_turn(env: Env[Any]) -> Source:
    items = env.items

    async def start(seed: int) -> Published:
        item = items[seed % len(items)]
        messages = env.prompt(item)

        async def act(reply: str) -> tuple[str, float, bool]:
            value = env.score(item, reply)
            score = float(await value if inspect.isawaitable(value) else value)
            return "", score, True

        return Published(str(messages[-1]["content"]), [dict(m) for m in messages], act, 1)

    return start


def _game(env: Any) -> Source:
    async def start(seed: int) -> Published:
        game = env.new_game(seed)
        system = [{"role": "system", "content": env.rules}] if env.rules else []
        first = game.observation()

        async def act(reply: str) -> tuple[str, float, bool]:
            game.act(reply)
            if game.done:
                return "", float(env.score(game)), True
            return game.observation(), 0.0, False

        user = {"role": "user", "content": first}
        return Published(first, [*system, user], act, env.config.max_turns)

    return start


def _textworld(env: Any) -> Source:
    from atropos.environments.textworld.game import TextGame, open_backend

    async def start(seed: int) -> Published:
        s = env.config
        path = await env.game_file(env.item(seed, s.first_seed, s.num_games))
        game = await asyncio.to_thread(
            lambda: TextGame(open_backend(path, s.list_commands), s.list_commands)
        )
        first = game.observation()

        async def act(reply: str) -> tuple[str, float, bool]:
            await asyncio.to_thread(game.act, reply)
            return game.observation(), game.rewards[-1], game.done

        messages = [{"role": "system", "content": env.rules}, {"role": "user", "content": first}]
        return Published(first, messages, act, s.max_turns, close=game.close)

    return start

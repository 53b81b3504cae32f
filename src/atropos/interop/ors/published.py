"""What an Atropos environment looks like from the ORS side: splits of tasks, and episodes with
tools that give rewards. One adapter per kind of environment:

- `SingleTurn`, for every `Env` (a dataset plus a reward: gsm8k, tool_calling, ...): the
  splits `train` (`load()`) and `test` (`load_eval()`, when it has items); the prompt is the
  env's `prompt(item)`; one tool, `answer {"answer": str}`, whose text is scored as the policy's
  whole completion would be (`score(item, answer)`), and which finishes the episode.
- `TextAdventure`, for `textworld`: the split `train` (the configured games: `--env.game_files`,
  else `--env.num_games` seeds from `--env.first_seed`); the prompt is the rules and the
  opening text; one tool, `act {"command": str}`, plays a command and answers the game's text,
  its reward the turn's score change over the maximum (so an episode's rewards sum to its
  score), finished when the game is won or lost or after `--env.max_turns` commands.

Any other environment plays its episodes through its own loop against an inference server, so
it cannot be driven a turn at a time by a remote policy; `adapter` refuses it by name.

A task is `{"split": S, "index": I}` (our items need not be JSON); the item is looked up again.
"""

from __future__ import annotations

import asyncio
import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from atropos.envs.base import BaseEnv
from atropos.envs.simple import Env

__all__ = ["Adapter", "Episode", "SingleTurn", "Step", "TextAdventure", "adapter"]


@dataclass(frozen=True)
class Step:
    """What a tool call gives: the text, the reward (None: none) and whether it finished."""

    text: str
    reward: float | None = None
    finished: bool = False


class Episode(ABC):
    """One session's episode: its prompt messages, its tools, and calls to them."""

    messages: list[dict[str, Any]]

    @abstractmethod
    async def call(self, name: str, arguments: dict[str, Any]) -> Step:
        """Run tool `name`; ValueError for an unknown tool or bad arguments (the policy's)."""

    @abstractmethod
    async def close(self) -> None:
        """Free what the episode holds."""


class Adapter(ABC):
    """An environment as ORS tasks and episodes."""

    tools: list[dict[str, Any]]  # ORS tool specs: name, description, input_schema

    def __init__(self, env: BaseEnv[Any]) -> None:
        self.env = env
        self.splits: dict[str, list[Any]] = {}

    @abstractmethod
    async def setup(self) -> None:
        """Load the splits."""

    @abstractmethod
    async def start(self, item: Any) -> Episode:
        """A new episode of `item`."""


def _tool(name: str, description: str, field: str, about: str) -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": {field: {"type": "string", "description": about}},
        "required": [field],
    }
    return {"name": name, "description": description, "input_schema": schema}


def _text_argument(name: str, arguments: dict[str, Any], field: str) -> str:
    value = arguments.get(field)
    if not isinstance(value, str):
        raise ValueError(f"{name} takes {{{field!r}: string}}; got {sorted(arguments)}")
    return value


class SingleTurn(Adapter):
    """An `Env`: one `answer` per episode, scored by the env."""

    tools = [
        _tool("answer", "Give your final answer; it ends the episode.", "answer", "your answer")
    ]

    async def setup(self) -> None:
        env: Any = self.env
        self.splits["train"] = list(await asyncio.to_thread(env.load))
        test = list(await asyncio.to_thread(env.load_eval))
        if test:
            self.splits["test"] = test

    async def start(self, item: Any) -> Episode:
        return _Answer(self.env, item)


class _Answer(Episode):
    def __init__(self, env: Any, item: Any) -> None:
        self.env, self.item = env, item
        self.messages = list(env.prompt(item))

    async def call(self, name: str, arguments: dict[str, Any]) -> Step:
        if name != "answer":
            raise ValueError(f"{name!r} is not a valid tool (the tool: 'answer')")
        text = _text_argument(name, arguments, "answer")
        value = self.env.score(self.item, text)
        score = float(await value if inspect.isawaitable(value) else value)
        return Step(f"score: {score:g}", score, True)

    async def close(self) -> None:
        return None


class TextAdventure(Adapter):
    """`textworld`: one `act` per command until the game ends."""

    tools = [
        _tool("act", "Play one command in the game.", "command", "e.g. 'open door', 'go east'")
    ]

    async def setup(self) -> None:
        env: Any = self.env
        await env.setup()
        s = env.config
        count = len(env.files) if env.files else (s.num_games or 100)
        self.splits["train"] = [env.item(i, s.first_seed, s.num_games) for i in range(count)]

    async def start(self, item: Any) -> Episode:
        from atropos.environments.textworld.game import TextGame, open_backend

        env: Any = self.env
        path = await env.game_file(item)
        lists = env.config.list_commands
        game = await asyncio.to_thread(lambda: TextGame(open_backend(path, lists), lists))
        return _Adventure(game, env.rules, env.config.max_turns)


class _Adventure(Episode):
    def __init__(self, game: Any, rules: str, max_turns: int) -> None:
        self.game, self.max_turns, self.turns = game, max_turns, 0
        self.messages = [
            {"role": "system", "content": rules},
            {"role": "user", "content": game.observation()},
        ]
        self.lock = asyncio.Lock()

    async def call(self, name: str, arguments: dict[str, Any]) -> Step:
        if name != "act":
            raise ValueError(f"{name!r} is not a valid tool (the tool: 'act')")
        command = _text_argument(name, arguments, "command")
        async with self.lock:  # one command at a time: the game has one state
            await asyncio.to_thread(self.game.act, command)
            self.turns += 1
            text = await asyncio.to_thread(self.game.observation)
        done = self.game.done or self.turns >= self.max_turns
        return Step(text, float(self.game.rewards[-1]), done)

    async def close(self) -> None:
        await asyncio.to_thread(self.game.close)


def adapter(env: BaseEnv[Any]) -> Adapter:
    """The adapter of `env`.

    Raises:
        ValueError: an environment that plays its own multi-turn loop (named, with the kinds
            that can be published).
    """
    if isinstance(env, Env):
        return SingleTurn(env)
    if type(env).__module__.startswith("atropos.environments.textworld"):
        return TextAdventure(env)
    raise ValueError(
        f"{type(env).__name__} cannot be published: it plays its episodes through its own loop"
        " against an inference server. Publishable: single-turn environments (atropos.envs.Env:"
        " gsm8k, tool_calling, ...) and textworld"
    )

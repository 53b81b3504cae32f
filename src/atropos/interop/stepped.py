"""The parts of a stepped episode (`interop.episodes` has the kinds and says how they are
served): `Step`, what a call or reply gives; `Episode`, driven by tool calls (ORS) or whole
replies (OpenEnv); `OneTool`, an episode whose one tool takes one string; `Adapter`, an
environment as splits, tools and episodes; ORS tool specs (`tool_spec`)."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from atropos.envs.base import BaseEnv

__all__ = ["OVER", "Adapter", "Episode", "OneTool", "Step", "text_argument", "tool_spec"]


@dataclass(frozen=True)
class Step:
    """What a call or reply gives: the text, the reward (None: none) and whether it finished."""

    text: str
    reward: float | None = None
    finished: bool = False
    messages: tuple[dict[str, Any], ...] = ()  # the turns it added (a reply's tool turns)


OVER = Step("the episode is over: start another", 0.0, True)


def tool_spec(name: str, description: str, field: str, about: str) -> dict[str, Any]:
    """An ORS tool spec taking one string argument `field`."""
    schema = {
        "type": "object",
        "properties": {field: {"type": "string", "description": about}},
        "required": [field],
    }
    return {"name": name, "description": description, "input_schema": schema}


def text_argument(name: str, arguments: dict[str, Any], field: str) -> str:
    """The string `arguments[field]` of tool `name`; ValueError naming the form otherwise."""
    value = arguments.get(field)
    if not isinstance(value, str):
        raise ValueError(f"{name} takes {{{field!r}: string}}; got {sorted(arguments)}")
    return value


class Episode(ABC):
    """One episode: its opening messages, and calls or replies until it finishes."""

    messages: list[dict[str, Any]]
    max_turns: int = 1

    def __init__(self) -> None:
        self.turns = 0
        self.done = False
        self.lock = asyncio.Lock()

    async def call(self, name: str, arguments: dict[str, Any]) -> Step:
        """Run tool `name` (ValueError for an unknown tool or bad arguments)."""
        async with self.lock:
            return OVER if self.done else self._count(await self._call(name, arguments))

    async def reply(self, text: str) -> Step:
        """Play the policy's whole reply."""
        async with self.lock:
            return OVER if self.done else self._count(await self._reply(text))

    def _count(self, step: Step) -> Step:
        self.turns += 1
        if not step.finished and self.turns >= self.max_turns:
            step = self.cut(step)
        self.done = step.finished
        return step

    def cut(self, step: Step) -> Step:
        """`step` finishing the episode at `max_turns` (its reward kept, by default)."""
        return Step(step.text, step.reward, True)

    @abstractmethod
    async def _call(self, name: str, arguments: dict[str, Any]) -> Step: ...

    @abstractmethod
    async def _reply(self, text: str) -> Step: ...

    async def close(self) -> None:
        """Free what the episode holds (a game process)."""
        return None


class OneTool(Episode):
    """An episode with one tool taking one string, `field`: a call is a reply of that text."""

    tool = "answer"
    field = "answer"

    async def _call(self, name: str, arguments: dict[str, Any]) -> Step:
        if name != self.tool:
            raise ValueError(f"{name!r} is not a valid tool (the tool: {self.tool!r})")
        return await self._reply(text_argument(name, arguments, self.field))


class Adapter(ABC):
    """An environment as splits of items and episodes with tools."""

    tools: list[dict[str, Any]]

    def __init__(self, env: BaseEnv[Any]) -> None:
        self.env = env
        self.splits: dict[str, Sequence[Any]] = {}

    async def setup(self) -> None:
        """Set the environment up and load the splits."""
        await self.env.setup()
        await self.load()

    @abstractmethod
    async def load(self) -> None:
        """Fill `splits` (after the env's setup)."""

    @abstractmethod
    async def start(self, item: Any) -> Episode:
        """A new episode of `item`."""

    def item(self, seed: int) -> Any:
        """The train item a seed picks (OpenEnv's `reset(seed)`): seed modulo their number."""
        train = self.splits["train"]
        return train[seed % len(train)]

    async def close(self) -> None:
        """Release what the environment holds (its servers)."""
        await self.env.aclose()
